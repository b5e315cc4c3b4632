//! The same server over HTTPS (by default; a CA of its own per server) or plain HTTP/1.1 on a TCP
//! socket (hyper 1), identities from bearer tokens.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    sync::Arc,
};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::client::ConfigExt;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;

use crate::{
    kubeconfig,
    server::{Inner, TestServer},
    service::{error_response, handle, Refused, ResponseBody},
    status::ApiError,
    tls::{Pki, TlsError},
};

/// How [`TestServer::serve_http_with`] serves: HTTPS (the default) or plain HTTP.
///
/// Over plain HTTP, `kubectl` and client-go send no bearer token (they read credentials only for TLS
/// transports), so every kubectl request gets a 401: use HTTPS for kubectl and other real clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// TLS with a CA generated for this server and written into its kubeconfigs
    /// (`certificate-authority-data`), so clients verify the server.
    #[default]
    Https,
    /// Plain HTTP/1.1 (for clients of your own that send the token anyway).
    PlainHttp,
}

/// Bearer tokens are `kube-shard-testserver:<identity>` (see [`TestServer::token`]).
pub(crate) const TOKEN_PREFIX: &str = "kube-shard-testserver:";

/// A running HTTP server. Dropping it stops the server and closes its connections.
#[derive(Debug)]
#[must_use = "the HTTP server stops when this handle is dropped"]
pub struct HttpServer {
    addr: SocketAddr,
    pki: Option<Pki>,
    task: tokio::task::JoinHandle<()>,
}

/// Building a `kube::Client` for the HTTP server failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The kubeconfig was refused.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// The client could not be built.
    #[error("client: {0}")]
    Client(#[source] kube::Error),
    /// The TLS configuration of the client could not be built.
    #[error("tls: {0}")]
    Tls(#[source] TlsError),
}

impl HttpServer {
    pub(crate) async fn start(
        inner: Arc<Inner>,
        addr: SocketAddr,
        transport: Transport,
    ) -> std::io::Result<Self> {
        let pki = match transport {
            Transport::Https => {
                Some(Pki::generate(Some(addr.ip())).map_err(std::io::Error::other)?)
            }
            Transport::PlainHttp => None,
        };
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        *inner.address.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr.to_string());
        let acceptor = pki.as_ref().map(|p| TlsAcceptor::from(p.server.clone()));
        let task = tokio::spawn(accept_loop(inner, listener, acceptor));
        Ok(HttpServer { addr, pki, task })
    }

    /// The bound address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:PORT` (or `http://` for [`Transport::PlainHttp`]); an unspecified bind
    /// address (`0.0.0.0`, `::`) is given as `127.0.0.1`.
    #[must_use]
    pub fn url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        format!("{scheme}://{addr}")
    }

    /// The PEM of this server's CA (`None` over plain HTTP). It signs the serving certificate, valid
    /// for `127.0.0.1`, `::1`, `localhost` and the bound address.
    #[must_use]
    pub fn ca_pem(&self) -> Option<&str> {
        self.pki.as_ref().map(|p| p.ca_pem.as_str())
    }

    /// A kubeconfig (YAML) for this server as `identity`, with the CA as
    /// `certificate-authority-data` over HTTPS.
    #[must_use]
    pub fn kubeconfig_yaml(&self, identity: &str) -> String {
        kubeconfig::render(
            &self.url(),
            identity,
            &TestServer::token(identity),
            self.ca_pem(),
        )
    }

    /// Write a kubeconfig for this server as `identity` (see [`HttpServer::kubeconfig_yaml`]).
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>, identity: &str) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml(identity))
    }

    /// A `kube::Client` over HTTP(S) as `identity`, built from the kubeconfig this server writes.
    ///
    /// It brings its own rustls connector (ring, trusting only this server's CA), so it works
    /// whatever TLS feature of `kube` your crate enables, none included.
    pub async fn client(&self, identity: &str) -> Result<kube::Client, ClientError> {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml(identity))
            .map_err(ClientError::Kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(ClientError::Kubeconfig)?;
        let tls = match &self.pki {
            Some(p) => p.client_config(),
            None => Pki::no_roots_client_config(),
        }
        .map_err(ClientError::Tls)?;
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let hyper_client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build::<_, kube::client::Body>(connector);
        let auth = config.auth_layer().map_err(ClientError::Client)?;
        let service = tower::ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(auth)
            .map_err(BoxError::from)
            .service(hyper_client);
        Ok(kube::Client::new(service, config.default_namespace))
    }

    /// Stop serving (also done on drop).
    pub fn shutdown(self) {}
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn accept_loop(inner: Arc<Inner>, listener: TcpListener, tls: Option<TlsAcceptor>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            biased; // new connections first; finished ones are reaped whenever none is waiting
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors or similar: do not spin.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                let conn = inner.next_conn();
                let inner = inner.clone();
                let tls = tls.clone();
                conns.spawn(async move {
                    match tls {
                        // A failed handshake (a client that does not trust the CA) just closes.
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                serve_connection(inner, conn, stream).await;
                            }
                        }
                        None => serve_connection(inner, conn, stream).await,
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_connection<S>(inner: Arc<Inner>, conn: u64, stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| serve(inner.clone(), conn, req));
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), svc)
        .await;
}

fn identity_of(req: &http::Request<Incoming>) -> Option<String> {
    let auth = req
        .headers()
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let token = auth.strip_prefix("Bearer ")?.trim();
    token.strip_prefix(TOKEN_PREFIX).map(str::to_string)
}

async fn serve(
    inner: Arc<Inner>,
    conn: u64,
    req: http::Request<Incoming>,
) -> Result<http::Response<ResponseBody>, Refused> {
    let Some(identity) = identity_of(&req).filter(|i| !i.is_empty()) else {
        inner.ledger.error("system:anonymous");
        return Ok(error_response(&ApiError::unauthorized()));
    };
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => Bytes::new(),
    };
    handle(inner, Arc::from(identity), conn, parts, body).await
}
