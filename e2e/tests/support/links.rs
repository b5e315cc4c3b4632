//! Links between one process and one cluster, so a scenario can cut them one at a time (asymmetric
//! partitions), and a cluster's etcd stopped and resumed (real late commits).
//!
//! A [`Link`] is a TCP proxy on loopback in front of one apiserver. Cut, it keeps every connection open and
//! accepts new ones but moves no byte in either direction: requests hang until the client's timeout, as
//! behind a dropped route, and whatever was sent while cut is delivered when the link heals — a request the
//! client gave up on may then commit late.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A cluster of the HA scenarios: its admin kubeconfig and its apiserver's address.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub kubeconfig: PathBuf,
    pub server: SocketAddr,
}

impl Cluster {
    /// The clusters a multi-cluster scenario needs: cluster A (`KUBECONFIG`), cluster B
    /// (`KSHARD_E2E_PEER_KUBECONFIG`) and, with `witness`, the witness (`KSHARD_E2E_WITNESS_KUBECONFIG`).
    /// `None` when one is not given: the scenario is skipped, and says so by name (a one-cluster run of the
    /// suite passes).
    pub fn for_scenario(scenario: &str, witness: bool) -> Option<Vec<Cluster>> {
        let mut wanted = vec![
            ("KUBECONFIG", "cluster A"),
            ("KSHARD_E2E_PEER_KUBECONFIG", "cluster B"),
        ];
        if witness {
            wanted.push(("KSHARD_E2E_WITNESS_KUBECONFIG", "the witness cluster"));
        }
        let missing: Vec<&str> = wanted
            .iter()
            .filter(|(var, _)| std::env::var_os(var).is_none_or(|v| v.is_empty()))
            .map(|(var, _)| *var)
            .collect();
        if !missing.is_empty() {
            skip(
                scenario,
                &format!(
                    "needs {} clusters; set {} (each the kubeconfig of one cluster, e.g. of a kind cluster)",
                    wanted.len(),
                    missing.join(" and ")
                ),
            );
            return None;
        }
        Some(
            wanted
                .iter()
                .map(|(var, what)| Cluster::from_env(var, what))
                .collect(),
        )
    }

    /// Clusters A and B of a two-cluster scenario, or `None` (skipped, by name): [`Cluster::for_scenario`].
    pub fn pair_for_scenario(scenario: &str) -> Option<(Cluster, Cluster)> {
        let mut clusters = Cluster::for_scenario(scenario, false)?.into_iter();
        Some((clusters.next()?, clusters.next()?))
    }

    /// The cluster named by the environment variable `var` (a kubeconfig path), or a clear panic.
    fn from_env(var: &str, what: &str) -> Cluster {
        let path = std::env::var_os(var)
            .unwrap_or_else(|| panic!("set {var} to the kubeconfig of {what}"));
        let kubeconfig = PathBuf::from(path);
        let kc = Kubeconfig::read_from(&kubeconfig).expect("read the kubeconfig");
        let url = kc
            .clusters
            .first()
            .and_then(|c| c.cluster.as_ref())
            .and_then(|c| c.server.clone())
            .expect("a server in the kubeconfig");
        let hostport = url
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_string();
        let server = hostport.parse().unwrap_or_else(|_| {
            panic!("the HA scenarios need an apiserver at an IP:port (got {url})")
        });
        Cluster { kubeconfig, server }
    }

    /// An admin client, direct.
    pub async fn client(&self) -> Client {
        self.client_via(self.server).await
    }

    /// An admin client whose connections go to `addr` (a [`Link`]) instead of the apiserver.
    pub async fn client_via(&self, addr: SocketAddr) -> Client {
        let kc = Kubeconfig::read_from(&self.kubeconfig).expect("read the kubeconfig");
        let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("a config from the kubeconfig");
        cfg.cluster_url = format!("https://{addr}").parse().expect("a URL");
        Client::try_from(cfg).expect("a client")
    }

    /// The pid of this instance's etcd, when it is a `realkube` instance (its pid file beside the
    /// kubeconfig).
    pub fn etcd_pid(&self) -> Option<i32> {
        let dir = self.kubeconfig.parent()?;
        read_pid(&dir.join("etcd.pid"))
    }
}

/// Say, past libtest's output capture, that `scenario` is skipped and why: a skipped scenario passes, and
/// the run's output names it.
pub fn skip(scenario: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped {scenario}: {why}");
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Stop (`true`) or resume (`false`) a process: SIGSTOP / SIGCONT.
pub fn freeze(pid: i32, stop: bool) {
    use rustix::process::{kill_process, Pid, Signal};
    let pid = Pid::from_raw(pid).expect("a positive pid");
    let sig = if stop { Signal::STOP } else { Signal::CONT };
    kill_process(pid, sig).expect("signal the process");
}

/// A proxy in front of one apiserver for one process; see the module docs.
pub struct Link {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    pub async fn start(target: SocketAddr) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("an address");
        let (cut, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let rx = rx.clone();
                tokio::spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(target).await {
                        splice(inbound, outbound, rx).await;
                    }
                });
            }
        });
        Link { addr, cut, task }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cut (`true`) or heal (`false`) the link.
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn splice(a: TcpStream, b: TcpStream, rx: watch::Receiver<bool>) {
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    tokio::select! {
        _ = pump(ar, bw, rx.clone()) => {}
        _ = pump(br, aw, rx) => {}
    }
}

/// Copy bytes one way, holding each chunk while the link is cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
