//! The embedded API server (testserver) served over HTTP(S) as `kshard-dev testserver` serves it
//! ([`serve`]), or from a thread of its own ([`BackgroundServer`]) for tests whose clients are other
//! processes (the CLI, replica processes) and whose own code is synchronous.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use kube_shard_testserver::{HttpServer, TestServer, Transport};
use tokio::sync::oneshot;

/// A served embedded API server; stopped when dropped.
#[derive(Debug)]
pub struct BackgroundServer {
    kubeconfig: PathBuf,
    url: String,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// How to serve it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ServeOptions {
    /// The ShardedListAndWatch gate (KEP-5866 shardSelector).
    pub shard_selector: bool,
    /// Plain HTTP instead of HTTPS (kubectl sends no token over plain HTTP).
    pub plain_http: bool,
    /// Garbage collection and namespace finalisation (a bare kube-apiserver has neither).
    pub controllers: bool,
    /// Where to listen (port 0: a free one).
    pub listen: SocketAddr,
    /// The identity the kubeconfig's token stands for.
    pub identity: String,
}

impl Default for ServeOptions {
    /// Gate off, HTTPS, no controllers, a free loopback port, identity `admin`.
    fn default() -> Self {
        ServeOptions {
            shard_selector: false,
            plain_http: false,
            controllers: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            identity: "admin".to_owned(),
        }
    }
}

/// Serve a fresh server as `opts` says, writing its kubeconfig to `kubeconfig` (if any) before
/// returning; it serves until the returned pair is dropped.
pub async fn serve(
    opts: &ServeOptions,
    kubeconfig: Option<&Path>,
) -> std::io::Result<(TestServer, HttpServer)> {
    let server = TestServer::builder()
        .shard_selector(opts.shard_selector)
        .controllers(opts.controllers)
        .build();
    let transport = if opts.plain_http {
        Transport::PlainHttp
    } else {
        Transport::Https
    };
    let http = server.serve_http_with(opts.listen, transport).await?;
    if let Some(path) = kubeconfig {
        http.write_kubeconfig(path, &opts.identity)?;
    }
    Ok((server, http))
}

impl BackgroundServer {
    /// Serve a fresh server on a loopback port and write a kubeconfig for identity `admin` to
    /// `kubeconfig` before returning.
    pub fn start(kubeconfig: &Path, opts: ServeOptions) -> std::io::Result<BackgroundServer> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let path = kubeconfig.to_owned();
        let thread = std::thread::Builder::new()
            .name("testserver".into())
            .spawn(move || {
                let served = serve_until(&path, opts, stop_rx, |url| {
                    let _ = ready_tx.send(Ok(url));
                });
                if let Err(e) = served {
                    let _ = ready_tx.send(Err(e));
                }
            })?;
        let url = ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("the server thread ended before serving"))??;
        Ok(BackgroundServer {
            kubeconfig: kubeconfig.to_owned(),
            url,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The kubeconfig it wrote.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Its URL (`http://127.0.0.1:PORT` or `https://...`).
    pub fn url(&self) -> &str {
        &self.url
    }
}

fn serve_until(
    kubeconfig: &Path,
    opts: ServeOptions,
    stop: oneshot::Receiver<()>,
    ready: impl FnOnce(String),
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (_server, http) = serve(&opts, Some(kubeconfig)).await?;
        ready(http.url());
        let _ = stop.await;
        Ok(())
    })
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
