//! The `estafeta` binary: parses the command line and hands over to the
//! library (`serve`), to the client (`admin …`), or to the demo (`demo`).

#[cfg(feature = "demo")]
mod demo;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use estafeta_exchange::tenancy::AdminToken;
use estafeta_server::config::SETTINGS_HELP;
use estafeta_server::open::open_exchange;
use estafeta_server::operator::{self, AdminArgs};
use estafeta_server::{Settings, run_with};

/// Estafeta: a reliable message server between mobile devices and database
/// processors.
#[derive(Debug, Parser)]
#[command(name = "estafeta", version, after_help = SETTINGS_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server (with no configuration at all: data in
    /// ./estafeta-data, listening on 127.0.0.1:8080).
    #[command(after_help = SETTINGS_HELP)]
    Serve {
        /// A TOML file with settings (default: estafeta.toml, if present).
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Provision and inspect through the admin API: enterprise, subsystem,
    /// database and device creation, processes, stats.
    Admin(AdminArgs),
    /// A server on a temporary data folder with simulated devices and
    /// processors; prints the dashboard address and the admin token.
    #[cfg(feature = "demo")]
    Demo {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// Stop after this long (e.g. `30s`, `5m`); default: until Ctrl-C.
        #[arg(long, value_parser = humantime::parse_duration)]
        duration: Option<std::time::Duration>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // `serve` also keeps the structured event log in its data folder.
    let event_log_data = match &cli.command {
        Command::Serve { config } => Some(Settings::load(config.as_deref())?.data_dir),
        Command::Admin(_) => None,
        #[cfg(feature = "demo")]
        Command::Demo { .. } => None,
    };
    estafeta_server::logging::init(event_log_data.as_deref())?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    match cli.command {
        Command::Serve { config } => runtime.block_on(serve(config)),
        Command::Admin(args) => {
            let out = runtime.block_on(operator::execute(&args))?;
            println!("{out}");
            Ok(())
        }
        #[cfg(feature = "demo")]
        Command::Demo { listen, duration } => runtime.block_on(demo::demo(&listen, duration)),
    }
}

async fn serve(config: Option<PathBuf>) -> anyhow::Result<()> {
    let settings = Settings::load(config.as_deref())?;
    tracing::info!(?settings, "starting");
    #[cfg(feature = "failpoints")]
    {
        let armed = estafeta_server::failpoints::arm_from_env()?;
        if !armed.is_empty() {
            // Before "listening on": the harness checks that its arming took.
            println!("failpoints armed: {}", armed.join(" "));
        }
    }
    let exchange_config = settings.exchange_config()?;
    let (exchange, admin) = open_exchange(
        exchange_config,
        Arc::new(estafeta_session::SystemClock),
        settings.disk_alert_mb << 20,
    )
    .await
    .with_context(|| format!("opening the data folder {}", settings.data_dir.display()))?;
    if let AdminToken::Generated(token) = admin {
        let kept = settings.data_dir.join(".estafeta").join("admin-token");
        println!(
            "admin token: {} (kept in {})",
            token.expose(),
            kept.display()
        );
    }
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .with_context(|| format!("listening on {}", settings.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    println!("listening on {addr}");
    let notify = settings.notify()?;
    run_with(
        listener,
        exchange,
        settings.http(),
        notify,
        shutdown_signal(),
    )
    .await?;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot watch SIGTERM; stopping on SIGINT only");
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
