//! The same server over HTTP/1.1 on a TCP socket (hyper 1), identities from bearer tokens.

use std::{net::SocketAddr, path::Path, sync::Arc};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, task::JoinSet};

use crate::{
    server::{Inner, TestServer},
    service::{error_response, handle, Refused, ResponseBody},
    status::ApiError,
};

/// Bearer tokens are `kube-shard-testserver:<identity>` (see [`TestServer::token`]).
pub(crate) const TOKEN_PREFIX: &str = "kube-shard-testserver:";

/// A running HTTP server. Dropping it stops the server and closes its connections.
#[derive(Debug)]
#[must_use = "the HTTP server stops when this handle is dropped"]
pub struct HttpServer {
    addr: SocketAddr,
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
}

impl HttpServer {
    pub(crate) async fn start(inner: Arc<Inner>, addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        *inner.address.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr.to_string());
        let task = tokio::spawn(accept_loop(inner, listener));
        Ok(HttpServer { addr, task })
    }

    /// The bound address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig (YAML) for this server as `identity`.
    #[must_use]
    pub fn kubeconfig_yaml(&self, identity: &str) -> String {
        TestServer::kubeconfig_yaml(&self.url(), identity)
    }

    /// Write a kubeconfig for this server as `identity`.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>, identity: &str) -> std::io::Result<()> {
        TestServer::write_kubeconfig(path, &self.url(), identity)
    }

    /// A `kube::Client` over HTTP as `identity`, built from the kubeconfig this server writes.
    pub async fn client(&self, identity: &str) -> Result<kube::Client, ClientError> {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml(identity))
            .map_err(ClientError::Kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(ClientError::Kubeconfig)?;
        kube::Client::try_from(config).map_err(ClientError::Client)
    }

    /// Stop serving (also done on drop).
    pub fn shutdown(self) {}
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors or similar: do not spin.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                let conn = inner.next_conn();
                let inner = inner.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| serve(inner.clone(), conn, req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
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
