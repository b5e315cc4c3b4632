//! A minimal HTTP/1.1 endpoint: `/metrics` (Prometheus text), `/healthz`, `/readyz`. One request per
//! connection; enough for Prometheus and kubelet probes.

use std::sync::Arc;
use std::time::Duration;

use kube_shard::group::GroupHandle;
use kube_shard::watcher::WatcherStats;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::OperatorMetrics as OpMetrics;

#[derive(Clone)]
pub(super) struct State {
    pub(super) registry: Arc<Registry>,
    pub(super) handle: GroupHandle,
    pub(super) stats: WatcherStats,
    pub(super) metrics: OpMetrics,
}

impl State {
    fn ready(&self) -> bool {
        self.handle.health().is_ready() && self.stats.initialized()
    }

    fn metrics_text(&self) -> String {
        self.metrics.ready.set(i64::from(self.ready()));
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

pub(super) async fn serve(listener: TcpListener, state: State) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                let state = state.clone();
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), answer(conn, state)).await;
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn answer(mut conn: TcpStream, state: State) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or_default().split_whitespace();
    let method = parts.next().unwrap_or_default();
    let path = parts
        .next()
        .unwrap_or_default()
        .split('?')
        .next()
        .unwrap_or_default();
    let (code, ctype, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            state.metrics_text(),
        ),
        ("GET", "/healthz") => {
            if state.handle.health().is_live() {
                ("200 OK", "text/plain", "ok\n".to_owned())
            } else {
                (
                    "503 Service Unavailable",
                    "text/plain",
                    "self-fenced too long\n".to_owned(),
                )
            }
        }
        ("GET", "/readyz") => {
            if state.ready() {
                ("200 OK", "text/plain", "ok\n".to_owned())
            } else {
                (
                    "503 Service Unavailable",
                    "text/plain",
                    "not ready\n".to_owned(),
                )
            }
        }
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_owned()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_owned(),
        ),
    };
    let resp = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(resp.as_bytes()).await?;
    conn.shutdown().await
}

/// GET `path` from `http://addr` (for the demo's scrapes).
pub async fn get(addr: &str, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Ok(text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}
