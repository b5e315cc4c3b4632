//! TLS for the HTTP server: a CA generated per server (rcgen), a serving certificate it signs for the
//! loopback names, and the rustls configurations of both ends (ring as the crypto provider, chosen
//! explicitly so no process-wide default is needed).

use std::{net::IpAddr, sync::Arc};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::{
    crypto::ring::default_provider,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    ClientConfig, RootCertStore, ServerConfig,
};

/// Setting up TLS failed (certificate generation or the rustls configuration).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// Generating the CA or the serving certificate failed.
    #[error("certificate generation: {0}")]
    Certificate(#[from] rcgen::Error),
    /// rustls refused the configuration.
    #[error("rustls: {0}")]
    Rustls(#[from] rustls::Error),
}

/// One server's PKI: its CA (PEM, for kubeconfigs) and the rustls server configuration.
#[derive(Debug, Clone)]
pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    ca_der: CertificateDer<'static>,
    pub(crate) server: Arc<ServerConfig>,
}

impl Pki {
    /// A new CA and a serving certificate for `127.0.0.1`, `::1`, `localhost` and `extra_ip`.
    pub(crate) fn generate(extra_ip: Option<IpAddr>) -> Result<Self, TlsError> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kube-shard-testserver-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let mut names = vec![
            "127.0.0.1".to_string(),
            "::1".to_string(),
            "localhost".to_string(),
            "kubernetes.default.svc".to_string(),
        ];
        if let Some(ip) = extra_ip.filter(|ip| !ip.is_unspecified() && !ip.is_loopback()) {
            names.push(ip.to_string());
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-shard-testserver");
        let cert = params.signed_by(&key, &issuer)?;

        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut server = ServerConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key_der)?;
        // HTTP/1.1 only: the server speaks nothing else.
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Pki {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().clone(),
            server: Arc::new(server),
        })
    }

    /// A rustls client configuration that trusts only this server's CA.
    pub(crate) fn client_config(&self) -> Result<ClientConfig, TlsError> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der.clone())?;
        client_config(roots)
    }

    /// A client configuration that trusts nothing (for plain HTTP, where it is never used).
    pub(crate) fn no_roots_client_config() -> Result<ClientConfig, TlsError> {
        client_config(RootCertStore::empty())
    }
}

fn client_config(roots: RootCertStore) -> Result<ClientConfig, TlsError> {
    let config = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // ALPN is left to the connector (hyper-rustls sets http/1.1 itself).
    Ok(config)
}
