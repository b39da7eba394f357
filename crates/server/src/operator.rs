//! `estafeta admin …`: provisioning and inspection from a terminal, through
//! the HTTP admin API (the client crate), for operators who prefer it to
//! the dashboard. Each command prints the server's JSON answer.

use estafeta_client::{Client, ClientError};
use estafeta_exchange::Id;
use serde::Serialize;

/// Where the server is and the admin token to use.
#[derive(Debug, clap::Args)]
pub struct AdminArgs {
    /// The server's base URL.
    #[arg(long, env = "ESTAFETA_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The admin token.
    #[arg(long, env = "ESTAFETA_ADMIN_TOKEN", hide_env_values = true)]
    pub token: String,
    /// What to do.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// An admin command.
#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Enterprises (tenants).
    Enterprise {
        /// What to do with enterprises.
        #[command(subcommand)]
        command: EnterpriseCommand,
    },
    /// Subsystems (mobile applications) of an enterprise.
    Subsystem {
        /// What to do with subsystems.
        #[command(subcommand)]
        command: SubsystemCommand,
    },
    /// Databases (processors) of an enterprise.
    Database {
        /// What to do with databases.
        #[command(subcommand)]
        command: DatabaseCommand,
    },
    /// Devices of an enterprise.
    Device {
        /// What to do with devices.
        #[command(subcommand)]
        command: DeviceCommand,
    },
    /// List current and recently ended processes.
    Processes,
    /// Show counters per database and per device.
    Stats,
}

/// `admin enterprise …`.
#[derive(Debug, clap::Subcommand)]
pub enum EnterpriseCommand {
    /// Create an enterprise.
    Create {
        /// The new enterprise's id.
        id: Id,
    },
}

/// `admin subsystem …`.
#[derive(Debug, clap::Subcommand)]
pub enum SubsystemCommand {
    /// Create a subsystem of an enterprise.
    Create {
        /// The enterprise.
        enterprise: Id,
        /// The new subsystem's id.
        id: Id,
    },
}

/// `admin database …`.
#[derive(Debug, clap::Subcommand)]
pub enum DatabaseCommand {
    /// Create a database of an enterprise; prints its token (shown once).
    Create {
        /// The enterprise.
        enterprise: Id,
        /// The new database's id.
        id: Id,
    },
}

/// `admin device …`.
#[derive(Debug, clap::Subcommand)]
pub enum DeviceCommand {
    /// Create a device of an enterprise; prints its token (shown once).
    Create {
        /// The enterprise.
        enterprise: Id,
        /// The new device's id.
        id: Id,
        /// The subsystem (mobile application) the device runs.
        #[arg(long)]
        subsystem: Id,
    },
}

/// An admin command failed.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The call failed (transport, or the server's error answer).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The answer could not be printed.
    #[error("printing the answer failed: {0}")]
    Print(#[from] serde_json::Error),
}

/// Runs the command against the server; the answer as pretty JSON.
pub async fn execute(args: &AdminArgs) -> Result<String, OperatorError> {
    let client = Client::new(&args.url, &args.token)?;
    match &args.command {
        AdminCommand::Enterprise {
            command: EnterpriseCommand::Create { id },
        } => pretty(&client.create_enterprise(id).await?),
        AdminCommand::Subsystem {
            command: SubsystemCommand::Create { enterprise, id },
        } => pretty(&client.create_subsystem(enterprise, id).await?),
        AdminCommand::Database {
            command: DatabaseCommand::Create { enterprise, id },
        } => pretty(&client.create_database(enterprise, id).await?),
        AdminCommand::Device {
            command:
                DeviceCommand::Create {
                    enterprise,
                    id,
                    subsystem,
                },
        } => pretty(&client.create_device(enterprise, id, subsystem).await?),
        AdminCommand::Processes => pretty(&client.processes().await?),
        AdminCommand::Stats => pretty(&client.stats().await?),
    }
}

fn pretty<T: Serialize>(value: &T) -> Result<String, OperatorError> {
    Ok(serde_json::to_string_pretty(value)?)
}
