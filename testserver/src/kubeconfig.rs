//! An ordinary kubeconfig with a `token:` user.

/// Quote a YAML scalar (double quotes, JSON escaping is valid YAML).
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

pub(crate) fn render(url: &str, identity: &str, token: &str) -> String {
    let user = format!("testserver-{identity}");
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testserver
  cluster:
    server: {url}
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
