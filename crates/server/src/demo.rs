//! `estafeta demo` (with the `demo` feature): a server on a temporary data
//! folder with an enterprise, databases and devices provisioned, the
//! simulated devices and processors of [`estafeta_sim`] exchanging messages
//! through it, and the dashboard's address and admin token printed, until
//! SIGINT (Ctrl-C), SIGTERM or `--duration`. Like `serve`, it keeps the
//! structured event log in its data folder, so the dashboard's event log
//! shows the demo's provisioning, protocol steps and alerts. Nothing is
//! left behind: the folder goes away when the demo ends, by a signal too.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use estafeta_client::Client;
use estafeta_exchange::tenancy::AdminToken;
use estafeta_exchange::{ExchangeConfig, Id};
use estafeta_server::notify::NotifySettings;
use estafeta_server::{HttpSettings, Server, Settings};
use estafeta_sim::{Device, Processor, ProcessorConfig};
use tokio_util::sync::CancellationToken;

/// The databases and devices the demo provisions.
const DATABASES: [&str; 2] = ["db-north", "db-south"];
const DEVICES: [&str; 4] = ["phone-1", "phone-2", "phone-3", "phone-4"];

/// Runs the demo on `listen` until `stop` resolves, or for `duration`,
/// logging as `logging` says (stderr lines, and the event log in its data
/// folder).
pub(crate) async fn demo(
    listen: &str,
    duration: Option<Duration>,
    logging: &Settings,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let folder = tempfile::Builder::new()
        .prefix("estafeta-demo-")
        .tempdir()
        .context("making a temporary data folder")?;
    let event_log = estafeta_server::logging::init_with_event_log(logging, folder.path())?;
    let mut config = ExchangeConfig::new(folder.path());
    config.started_timeout = Duration::from_secs(30);
    config.ready_timeout = Duration::from_secs(60);
    let (server, admin_token) = Server::open_with(
        config,
        Arc::new(estafeta_session::SystemClock),
        HttpSettings::default(),
        NotifySettings::log_only(folder.path()),
        None,
        Some(&event_log),
    )
    .await?;
    let AdminToken::Generated(token) = admin_token else {
        bail!("a fresh data folder must get a fresh admin token");
    };
    let token = token.expose().to_owned();
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let addr = listener.local_addr()?;
    let stop_server = CancellationToken::new();
    let server = tokio::spawn(server.run(listener, stop_server.clone()));

    let admin = Client::new(&format!("http://{addr}"), &token)?;
    wait_ready(&admin).await?;
    let (devices, processors) = provision(&admin, folder.path()).await?;
    // The provisioning's events are in the event log before the address
    // is shown.
    let flushing = event_log.clone();
    tokio::task::spawn_blocking(move || flushing.flush()).await?;
    println!("listening on {addr}");
    println!("dashboard: http://{addr}/admin");
    println!("admin token: {token}");
    println!(
        "data folder: {} (removed at the end)",
        folder.path().display()
    );

    let stop_signal = stop;
    let stop = Arc::new(AtomicBool::new(false));
    let devices: Vec<_> = devices
        .into_iter()
        .map(|device| tokio::spawn(device_loop(device, stop.clone())))
        .collect();
    let processors: Vec<_> = processors
        .into_iter()
        .map(|processor| tokio::spawn(processor_loop(processor, stop.clone())))
        .collect();
    match duration {
        Some(d) => {
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = stop_signal => {}
            }
        }
        None => stop_signal.await,
    }
    stop.store(true, Ordering::Relaxed);
    let (mut uploaded, mut replies) = (0, 0);
    for task in devices {
        match task.await {
            Ok((sent, received)) => {
                uploaded += sent;
                replies += received;
            }
            Err(e) => tracing::error!(error = %e, "a device task panicked"),
        }
    }
    for task in processors {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "a processor task panicked");
        }
    }
    stop_server.cancel();
    server.await.context("the server task")??;
    // Written before the folder goes.
    tokio::task::spawn_blocking(move || event_log.flush()).await?;
    println!("demo stopped: {uploaded} messages uploaded, {replies} replies received");
    Ok(())
}

/// `/readyz` answers 200 once start-up recovery is done.
async fn wait_ready(admin: &Client) -> anyhow::Result<()> {
    for _ in 0..500 {
        if admin.readyz().await.unwrap_or(false) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the demo server did not become ready")
}

/// Enterprise `demo` with subsystem `sales`, the [`DATABASES`] (a
/// processor each, on a SQLite file in the data folder) and the [`DEVICES`].
async fn provision(
    admin: &Client,
    folder: &std::path::Path,
) -> anyhow::Result<(Vec<(Device, Vec<Id>)>, Vec<Processor>)> {
    let ent: Id = "demo".parse()?;
    let sales: Id = "sales".parse()?;
    admin.create_enterprise(&ent).await?;
    admin.create_subsystem(&ent, &sales).await?;
    let mut processors = Vec::new();
    let mut dbs = Vec::new();
    for (i, name) in DATABASES.iter().enumerate() {
        let db: Id = name.parse()?;
        let creds = admin.create_database(&ent, &db).await?;
        let mut config = ProcessorConfig::new(db.clone());
        config.seed = i as u64;
        config.deadlock_rate = 0.05;
        config.incorrect_rate = 0.05;
        config.commit_failure_rate = 0.02;
        let sqlite = folder.join(format!("{name}.processor.sqlite"));
        processors.push(Processor::open(
            &sqlite,
            admin.with_token(&creds.token),
            config,
        )?);
        dbs.push(db);
    }
    let mut devices = Vec::new();
    for name in DEVICES {
        let id: Id = name.parse()?;
        let creds = admin.create_device(&ent, &id, &sales).await?;
        devices.push((
            Device::new(admin.with_token(&creds.token), id, "demo"),
            dbs.clone(),
        ));
    }
    Ok((devices, processors))
}

/// A device uploads to each database in turn and reads its replies; how
/// many messages it uploaded and how many replies it received.
async fn device_loop(
    (mut device, dbs): (Device, Vec<Id>),
    stop: Arc<AtomicBool>,
) -> (usize, usize) {
    let mut turn = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let to = &dbs[turn % dbs.len()];
        turn += 1;
        if let Err(e) = device.compose(to) {
            tracing::warn!(error = %e, "composing a demo message");
        }
        if let Err(e) = device.flush().await {
            tracing::warn!(device = %device.id(), error = %e, "upload failed");
        }
        if let Err(e) = device.poll(50).await {
            tracing::warn!(device = %device.id(), error = %e, "inbox read failed");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (device.sent().len(), device.received().count())
}

/// A processor runs processes until its queue is empty, then waits a little.
async fn processor_loop(mut processor: Processor, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = processor.run_until_idle().await {
            tracing::warn!(error = %e, "processor cycle failed");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
