//! The `estafeta` binary: parses the command line and hands over to the
//! library (`serve`, `config`), to the client (`admin …`), or to the demo
//! (`demo`); `completions` and `man` print what clap derives from this
//! command line for shells and `man`. The command line is the binary's
//! alone: the `admin …` commands ([`admin_commands`]) and the options that choose
//! the settings ([`SettingsArgs`]) live here, not in the library.

mod admin_commands;
#[cfg(feature = "demo")]
mod demo;

#[cfg(feature = "demo")]
use estafeta_server::config::{LogFilter, Value as _};

use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use admin_commands::AdminArgs;
use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};
use estafeta_exchange::DataLayout;
use estafeta_exchange::tenancy::AdminToken;
use estafeta_server::Settings;
use estafeta_server::config;
use estafeta_server::events::EventLogHandle;
use estafeta_server::open::open_server;
use tokio_util::sync::CancellationToken;

/// The allocator of the whole server (see the workspace's `mimalloc`
/// entry). The benches that run the server or its scheduler in their own
/// process (this crate's `cycle` and `processing`, the `dispatch` benches
/// of `estafeta-repeat` and `estafeta-postgres`) declare the same.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Copy the data folder of a running server into DIR, consistently,
    /// without stopping it (writes wait during the copy; reads go on). DIR
    /// is a path on the server's host, new or empty, outside the data
    /// folder; on the same file system message files are hard links. To
    /// restore: stop the server and serve from the copy (`estafeta serve
    /// --data-dir DIR`), or move it into place of the data folder.
    Backup {
        /// Where the server is.
        #[arg(long, env = "ESTAFETA_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The admin token.
        #[arg(long, env = "ESTAFETA_ADMIN_TOKEN", hide_env_values = true)]
        token: String,
        /// The folder to make the copy in (relative to the current folder).
        dir: PathBuf,
    },
    /// Print the completion script of a shell, e.g. `estafeta completions
    /// bash > /usr/share/bash-completion/completions/estafeta` (for zsh:
    /// a `_estafeta` file in a folder of `$fpath`; for fish:
    /// `~/.config/fish/completions/estafeta.fish`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page estafeta(1) in roff (`estafeta man | man -l -`),
    /// or write one page per command into a folder.
    Man {
        /// Write estafeta.1, estafeta-serve.1, estafeta-admin.1, … into this
        /// folder (e.g. /usr/local/share/man/man1) instead.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Check the state files of the data folder (with the server stopped):
    /// one line per file (ok, repaired, absent, in use or DAMAGED with what
    /// to do), repairing what redb can. In cluster mode (`store` set), check
    /// that the database answers and that its schema is not newer than this
    /// build. Exit status 0 when fit to serve from, 1 otherwise.
    Check(SettingsArgs),
    /// A server on a temporary data folder with simulated devices and
    /// processors; prints the dashboard address and the admin token. Logs
    /// warnings only unless ESTAFETA_LOG says otherwise; removes its folder
    /// when it stops (Ctrl-C, SIGTERM or --duration).
    #[cfg(feature = "demo")]
    Demo {
        /// Where to listen (not serve's 8080, so that both can run at once).
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: String,
        /// Stop after this long (e.g. `30s`, `5m`); default: until Ctrl-C
        /// or SIGTERM.
        #[arg(long, value_parser = humantime::parse_duration)]
        duration: Option<std::time::Duration>,
    },
}

/// The demo's log filter when `ESTAFETA_LOG` is not set.
#[cfg(feature = "demo")]
const DEMO_LOG: &str = "warn";

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            private_files();
            let settings = args.sources().resolve()?.settings;
            // `serve` also keeps the structured event log in its data folder.
            let event_log =
                estafeta_server::logging::init_with_event_log(&settings, &settings.data_dir)?;
            runtime()?.block_on(serve(settings, event_log))
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
            estafeta_server::logging::init(&Settings::logging_from_env())?;
            let out = runtime()?.block_on(admin_commands::execute(&args))?;
            if let Some(warning) = out.warning {
                eprintln!("warning: {warning}");
            }
            println!("{}", out.json);
            Ok(())
        }
        Command::Backup { url, token, dir } => {
            let report = runtime()?.block_on(request_backup(&url, &token, &dir))?;
            println!("{report}");
            Ok(())
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "estafeta", &mut script);
            print_bytes(&script)
        }
        Command::Man { out_dir } => match out_dir {
            Some(dir) => clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("writing the manual pages into {}", dir.display())),
            None => {
                let mut page = Vec::new();
                clap_mangen::Man::new(Cli::command()).render(&mut page)?;
                print_bytes(&page)
            }
        },
        Command::Check(args) => {
            let settings = args.sources().resolve()?.settings;
            if let Some(url) = &settings.store {
                let report = runtime()?.block_on(estafeta_server::check::check_cluster(
                    url.expose(),
                    url.masked(),
                ));
                println!("{report}");
                if !report.is_fit() {
                    std::process::exit(1);
                }
                return Ok(());
            }
            let data_dir = settings.data_dir;
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
            let mut logging = Settings::logging_from_env();
            // Quiet unless asked: the address and the token stay on screen
            // instead of scrolling away under the simulators' protocol steps.
            if std::env::var_os("ESTAFETA_LOG").is_none() {
                logging.log = LogFilter::parse(DEMO_LOG).map_err(anyhow::Error::msg)?;
            }
            runtime()?.block_on(async {
                demo::demo(&listen, duration, &logging, shutdown_signal()?).await
            })
        }
    }
}

/// Every folder and file the server makes from here on is its user's alone
/// (0700, 0600), whatever umask it was started with: other local users can
/// neither read messages nor plant files that a rescan would pick up.
fn private_files() {
    use rustix::fs::Mode;
    rustix::process::umask(Mode::RWXG | Mode::RWXO);
}

/// `estafeta backup DIR`: asks the server at `url` to copy its data folder
/// into `dir` (made absolute against the current folder); the server's
/// answer as JSON, or its error.
async fn request_backup(url: &str, token: &str, dir: &Path) -> anyhow::Result<String> {
    let dir = std::path::absolute(dir)?;
    let body = estafeta_server::backup::BackupRequest {
        version: estafeta_exchange::wire::Version,
        dir,
    };
    let endpoint = format!("{}/v1/admin/backup", url.trim_end_matches('/'));
    let answer = reqwest::Client::new()
        .post(&endpoint)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("asking {endpoint}: {e}"))?;
    let status = answer.status();
    let text = answer
        .text()
        .await
        .map_err(|e| anyhow::anyhow!("reading the answer of {endpoint}: {e}"))?;
    if !status.is_success() {
        let message = serde_json::from_str::<estafeta_exchange::wire::ErrorBody>(&text)
            .map(|e| format!("{}: {}", e.error.code, e.error.message))
            .unwrap_or(text);
        anyhow::bail!("the backup failed ({status}): {message}");
    }
    Ok(text)
}

/// Writes `bytes` to stdout: an error (a closed pipe) is reported, not a
/// panic as `print!` would make it.
fn print_bytes(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new().context("starting the async runtime")
}

async fn serve(settings: Settings, event_log: EventLogHandle) -> anyhow::Result<()> {
    tracing::info!(?settings, "starting");
    #[cfg(feature = "failpoints")]
    {
        let armed = estafeta_server::failpoints::arm_from_env()?;
        if !armed.is_empty() {
            // Before "listening on": the harness checks that its arming took.
            println!("failpoints armed: {}", armed.join(" "));
        }
    }
    estafeta_server::check::before_serving(&settings.data_dir, event_log.file())?;
    let exchange_config = settings.exchange_config()?;
    let (server, admin) = open_server(
        exchange_config,
        Arc::new(estafeta_session::SystemClock),
        settings.http(),
        settings.notify()?,
        settings.disk_alert_mb << 20,
        settings.cluster_store().as_ref(),
        Some(&event_log),
    )
    .await
    .with_context(|| format!("opening the data folder {}", settings.data_dir.display()))?;
    if let AdminToken::Generated(token) = admin {
        match settings.store {
            None => {
                let kept = DataLayout::new(&settings.data_dir).admin_token();
                println!(
                    "admin token: {} (shown once; {} keeps only its hash)",
                    token.expose(),
                    kept.display()
                );
            }
            Some(_) => println!(
                "admin token: {} (shown once; the cluster store keeps only its hash)",
                token.expose()
            ),
        }
    }
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .with_context(|| format!("listening on {}", settings.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    println!("listening on {addr}");
    let shutdown = CancellationToken::new();
    let signal = shutdown_signal()?;
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            signal.await;
            shutdown.cancel();
        }
    });
    let ran = server.run(listener, shutdown).await;
    // What the event log still has queued is written before the process ends.
    tokio::task::spawn_blocking(move || event_log.flush()).await?;
    ran?;
    Ok(())
}

/// A future that resolves on SIGINT or SIGTERM. Both are watched from this
/// call on, not from the future's first poll: a signal that arrives before
/// the caller awaits is kept, not left to its default action (which would
/// end the process without its clean-up).
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("watching SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("watching SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

/// The command-line options that choose the settings (`serve`, `config`).
#[derive(Clone, Debug, Default, clap::Args)]
struct SettingsArgs {
    /// A TOML file with settings [default: ./estafeta.toml, if present]
    #[arg(long, value_name = "PATH", env = config::CONFIG_VARIABLE)]
    config: Option<PathBuf>,
    /// The address to listen on (over ESTAFETA_LISTEN and the file)
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// The data folder (over ESTAFETA_DATA_DIR and the file)
    #[arg(long, value_name = "PATH")]
    data_dir: Option<String>,
}

impl SettingsArgs {
    /// The file, the process environment and these flags.
    fn sources(&self) -> config::Sources {
        let mut sources = config::Sources::process(self.config.as_deref());
        if let Some(listen) = &self.listen {
            sources.flags.push(("--listen", "listen", listen.clone()));
        }
        if let Some(data_dir) = &self.data_dir {
            sources
                .flags
                .push(("--data-dir", "data_dir", data_dir.clone()));
        }
        sources
    }
}
