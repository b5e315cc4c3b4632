//! `kshard operator`: the example sharded operator (a hidden subcommand; the example's Deployment in
//! `deploy/` runs it, and the CLI and e2e tests start it as replica processes). Its start-up is the library
//! function `kube_shard_example_operator::run` (`kshard-dev operator` runs the same); this module also lends
//! the CLI its kube-config loading.
//!
//! Output contract: with `--metrics-addr`, the first stdout line is `metrics http://ADDR` once the
//! endpoint listens (`/metrics`, `/healthz`, `/readyz`).

use std::path::Path;

use kube::Client;
pub(crate) use kube_shard_example_operator::run::OperatorArgs;

use crate::cli::CliError;

/// Run the example operator until SIGTERM (or SIGINT) and its graceful leave.
pub(crate) fn run(args: OperatorArgs) -> Result<(), CliError> {
    Ok(kube_shard_example_operator::run::run(args)?)
}

/// A kube client from a kubeconfig file, or inferred.
pub(crate) async fn client_from(path: Option<&Path>) -> Result<Client, CliError> {
    Ok(kube_shard_example_operator::run::client_from(path).await?)
}
