//! An ordinary kubeconfig with a `token:` user and, over HTTPS, the server's CA.

use base64::{engine::general_purpose::STANDARD, Engine};

/// Quote a YAML scalar (double quotes, JSON escaping is valid YAML).
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

pub(crate) fn render(url: &str, identity: &str, token: &str, ca_pem: Option<&str>) -> String {
    let user = format!("testserver-{identity}");
    let ca = ca_pem
        .map(|pem| format!("\n    certificate-authority-data: {}", STANDARD.encode(pem)))
        .unwrap_or_default();
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testserver
  cluster:
    server: {url}{ca}
contexts:
- name: testserver
  context:
    cluster: testserver
    user: {user}
    namespace: default
current-context: testserver
preferences: {{}}
users:
- name: {user}
  user:
    token: {token}
",
        url = q(url),
        user = q(&user),
        token = q(token),
    )
}
