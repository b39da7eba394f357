//! The `estafeta` binary: parses the command line and hands over to the
//! library (`serve`, `config`), to the client (`admin …`), or to the demo
//! (`demo`).

#[cfg(feature = "demo")]
mod demo;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use estafeta_exchange::DataLayout;
use estafeta_exchange::tenancy::AdminToken;
use estafeta_server::config::{self, SettingsArgs};
use estafeta_server::open::open_exchange;
use estafeta_server::operator::{self, AdminArgs};
use estafeta_server::{Settings, run_with};

/// Estafeta: a reliable message server between mobile devices and database
/// processors.
#[derive(Debug, Parser)]
#[command(name = "estafeta", version, after_help = config::help())]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server (with no configuration at all: data in
    /// ./estafeta-data, listening on 127.0.0.1:8080).
    #[command(after_help = config::help())]
    Serve(SettingsArgs),
    /// Print the effective settings and where each comes from (secrets
    /// masked), or check a configuration file.
    #[command(after_help = config::help())]
    Config {
        #[command(flatten)]
        settings: SettingsArgs,
        /// Check this file as `serve --config PATH` would read it (with the
        /// environment): print "PATH: ok", or the error and exit non-zero.
        #[arg(long, value_name = "PATH")]
        check: Option<PathBuf>,
    },
    /// Provision and inspect through the admin API: enterprise, subsystem,
    /// database and device creation, processes, stats.
    Admin(AdminArgs),
    /// Check the state files of the data folder (with the server stopped):
    /// one line per file (ok, repaired, absent, in use or DAMAGED with what
    /// to do), repairing what redb can. Exit status 0 when every file is fit
    /// to serve from, 1 otherwise.
    Check(SettingsArgs),
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
    match cli.command {
        Command::Serve(args) => {
            let settings = args.sources().resolve()?.settings;
            // `serve` also keeps the structured event log in its data folder.
            estafeta_server::logging::init(&settings.log, Some(&settings.data_dir))?;
            runtime()?.block_on(serve(settings))
        }
        Command::Config { settings, check } => match check {
            Some(path) => {
                let sources = SettingsArgs {
                    config: Some(path.clone()),
                    ..settings
                }
                .sources();
                sources.resolve()?;
                println!("{}: ok", path.display());
                Ok(())
            }
            None => {
                print!("{}", settings.sources().resolve()?);
                Ok(())
            }
        },
        Command::Admin(args) => {
            estafeta_server::logging::init(&Settings::log_from_env(), None)?;
            let out = runtime()?.block_on(operator::execute(&args))?;
            if let Some(warning) = out.warning {
                eprintln!("warning: {warning}");
            }
            println!("{}", out.json);
            Ok(())
        }
        Command::Check(args) => {
            let data_dir = args.sources().resolve()?.settings.data_dir;
            let reports = estafeta_server::check::check(&data_dir);
            for report in &reports {
                println!("{report}");
            }
            if !reports.iter().all(|r| r.is_fit()) {
                std::process::exit(1);
            }
            Ok(())
        }
        #[cfg(feature = "demo")]
        Command::Demo { listen, duration } => {
            estafeta_server::logging::init(&Settings::log_from_env(), None)?;
            runtime()?.block_on(demo::demo(&listen, duration))
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new().context("starting the async runtime")
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    tracing::info!(?settings, "starting");
    #[cfg(feature = "failpoints")]
    {
        let armed = estafeta_server::failpoints::arm_from_env()?;
        if !armed.is_empty() {
            // Before "listening on": the harness checks that its arming took.
            println!("failpoints armed: {}", armed.join(" "));
        }
    }
    estafeta_server::check::before_serving(&settings.data_dir)?;
    let exchange_config = settings.exchange_config()?;
    let (exchange, admin) = open_exchange(
        exchange_config,
        Arc::new(estafeta_session::SystemClock),
        settings.disk_alert_mb << 20,
    )
    .await
    .with_context(|| format!("opening the data folder {}", settings.data_dir.display()))?;
    if let AdminToken::Generated(token) = admin {
        let kept = DataLayout::new(&settings.data_dir).admin_token();
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
