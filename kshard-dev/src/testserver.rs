//! `kshard-dev testserver`: run kube-shard's in-process API server standalone, over HTTPS (a CA of its own,
//! in the kubeconfig) or plain HTTP, for `kubectl` and any kube client.
//!
//! Output contract: the first stdout line is `serving <URL>`; a kubeconfig (one `token:` user, and the
//! server's CA as `certificate-authority-data` over HTTPS) is written before it when `--kubeconfig-out`
//! is given. Runs until interrupted (SIGINT or SIGTERM).

use std::{io::Write, net::SocketAddr, path::PathBuf};

use clap::Args;
use kube_shard_harness::server::{serve, ServeOptions};

use crate::DevError;

#[derive(Debug, Args)]
pub(crate) struct TestserverArgs {
    /// The address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    listen: SocketAddr,
    /// Write a kubeconfig for the server (with a bearer token) to this path.
    #[arg(long, value_name = "PATH")]
    kubeconfig_out: Option<PathBuf>,
    /// The ShardedListAndWatch feature gate (KEP-5866 shardSelector).
    #[arg(long, default_value = "off", value_parser = ["on", "off"])]
    shard_selector: String,
    /// The identity the kubeconfig's token stands for (requests are accounted per identity).
    #[arg(long, default_value = "admin")]
    identity: String,
    /// Serve plain HTTP instead of HTTPS (kubectl sends no token over plain HTTP: every request
    /// gets a 401; for clients of your own).
    #[arg(long)]
    plain_http: bool,
    /// Also run garbage collection and namespace finalisation (a bare kube-apiserver does not).
    #[arg(long)]
    controllers: bool,
}

pub(crate) fn run(args: &TestserverArgs, out: &mut impl Write) -> Result<(), DevError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut opts = ServeOptions::default();
        opts.shard_selector = args.shard_selector == "on";
        opts.plain_http = args.plain_http;
        opts.controllers = args.controllers;
        opts.listen = args.listen;
        opts.identity = args.identity.clone();
        let (_server, http) = serve(&opts, args.kubeconfig_out.as_deref()).await?;
        writeln!(out, "serving {}", http.url())?;
        out.flush()?;
        shutdown_signal().await?;
        Ok(())
    })
}

#[cfg(unix)]
async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(not(unix))]
async fn shutdown_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}
