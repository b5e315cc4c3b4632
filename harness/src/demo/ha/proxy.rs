//! An in-process L4 (TCP) proxy in front of a real cluster's apiserver: the demo's fault switch on real
//! clusters. Every participant reaches a cluster through one of these (its kubeconfig's server rewritten
//! to the proxy's `127.0.0.1` port; TLS passes through untouched, so the serving cert must cover
//! `127.0.0.1` or the client must name the server, `tls_server_name`). [`Proxy::cut`] partitions: new
//! connections are closed at once (refused), open ones are stalled (nothing is forwarded either way, as
//! on a dead link); when the cut is lifted the stalled connections are closed (the peers' TCP sessions
//! would not survive a long partition either) and new connections are forwarded again.

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A running proxy; stopped (with every connection it forwards) on [`Proxy::stop`] or drop.
#[derive(Debug)]
pub(crate) struct Proxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listen on `127.0.0.1:0` and forward every connection to `upstream` (`host:port`).
    pub(crate) async fn start(upstream: String) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (cut, rx) = watch::channel(false);
        let task = tokio::spawn(accept(listener, upstream, rx));
        Ok(Proxy { addr, cut, task })
    }

    /// The local address clients connect to.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `true`: partition (refuse new connections, stall open ones); `false`: heal (close the stalled
    /// ones, forward again).
    pub(crate) fn cut(&self, on: bool) {
        self.cut.send_replace(on);
    }

    /// Stop listening and close every connection.
    pub(crate) fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, upstream: String, cut: watch::Receiver<bool>) {
    // the connections live in the set: aborting this task drops it, which aborts them all
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((client, _)) = r else { continue };
                if *cut.borrow() {
                    drop(client);
                    continue;
                }
                conns.spawn(forward(client, upstream.clone(), cut.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn forward(mut client: TcpStream, upstream: String, mut cut: watch::Receiver<bool>) {
    let Ok(mut up) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = up.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut up) => return,
        r = cut.wait_for(|c| *c) => if r.is_err() { return },
    }
    // stalled: both sockets stay open, nothing moves, until the cut is lifted; then they are closed
    let _ = cut.wait_for(|c| !*c).await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An upstream that echoes every byte back.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> io::Result<Vec<u8>> {
        s.write_all(msg).await?;
        let mut buf = vec![0; msg.len()];
        s.read_exact(&mut buf).await?;
        Ok(buf)
    }

    const SHORT: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn forwards_then_stalls_open_connections_refuses_new_ones_and_heals() {
        let p = Proxy::start(echo().await.to_string()).await.unwrap();
        let mut open = TcpStream::connect(p.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut open, b"hello").await.unwrap(), b"hello");

        p.cut(true);
        // the open connection: nothing comes back
        let stalled = tokio::time::timeout(SHORT, roundtrip(&mut open, b"again")).await;
        assert!(stalled.is_err(), "a cut connection must stall: {stalled:?}");
        // a new connection is closed without an answer
        let mut fresh = TcpStream::connect(p.addr()).await.unwrap();
        let r = tokio::time::timeout(SHORT, roundtrip(&mut fresh, b"x"))
            .await
            .expect("a refused connection fails at once");
        assert!(
            r.is_err(),
            "a new connection through a cut must fail: {r:?}"
        );

        p.cut(false);
        // the stalled connection is closed (EOF or reset), not resumed
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(SHORT, open.read(&mut buf))
            .await
            .expect("the stalled connection is closed at the heal");
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
        // new connections work again
        let mut again = TcpStream::connect(p.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut again, b"back").await.unwrap(), b"back");
    }

    #[tokio::test]
    async fn stop_closes_every_connection() {
        let p = Proxy::start(echo().await.to_string()).await.unwrap();
        let mut open = TcpStream::connect(p.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut open, b"hi").await.unwrap(), b"hi");
        p.stop();
        let mut buf = [0u8; 4];
        let r = tokio::time::timeout(SHORT, async {
            let _ = open.write_all(b"hi").await;
            open.read(&mut buf).await
        })
        .await
        .expect("closed at once");
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    }

    #[tokio::test]
    async fn an_unreachable_upstream_closes_the_client() {
        // a port nobody listens on: bind, note it, drop
        let dead = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = dead.local_addr().unwrap();
        drop(dead);
        let p = Proxy::start(addr.to_string()).await.unwrap();
        let mut s = TcpStream::connect(p.addr()).await.unwrap();
        let r = tokio::time::timeout(SHORT, roundtrip(&mut s, b"x"))
            .await
            .expect("closed at once");
        assert!(r.is_err());
    }
}
