//! `estafeta admin …`: provisioning and inspection from a terminal, through
//! the HTTP admin API (the client crate), for operators who prefer it to
//! the dashboard. Each command prints the server's JSON answer; a forced
//! delete and a token rotation also print a warning on stderr.

use estafeta_client::{Client, ClientError};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::{Deleted, Settlement};
use estafeta_exchange::{Id, MessageId, ProcessId};
use serde::Serialize;

/// Where the server is and the admin token to use.
#[derive(Debug, clap::Args)]
pub(crate) struct AdminArgs {
    /// The server's base URL.
    #[arg(long, env = "ESTAFETA_URL", default_value = "http://127.0.0.1:8080")]
    pub(crate) url: String,
    /// The admin token.
    #[arg(long, env = "ESTAFETA_ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) token: String,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: AdminCommand,
}

/// An admin command.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum AdminCommand {
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
        command: EndpointCommand<DatabaseCreate>,
    },
    /// Devices of an enterprise.
    Device {
        /// What to do with devices.
        #[command(subcommand)]
        command: EndpointCommand<DeviceCreate>,
    },
    /// The admin token.
    Token {
        /// What to do with the admin token.
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// List current and recently ended processes.
    Processes,
    /// Settle a process in doubt, as its processor's late commit or
    /// rollback would.
    Settle {
        /// The process in doubt.
        pid: ProcessId,
        /// `commit` or `rollback`.
        #[arg(value_enum)]
        outcome: Outcome,
    },
    /// List the files of a mailbox's folder (with the error code and text
    /// of messages in `Error`, while the server remembers them).
    Folder {
        /// The database or device.
        mailbox: Id,
        /// Messages, Prepared, Log, Unknown or Error.
        #[arg(value_parser = parse_folder)]
        folder: Folder,
    },
    /// One message of `Unknown` or `Error`: show, requeue or discard it.
    Message {
        /// What to do with the message.
        #[command(subcommand)]
        command: MessageCommand,
    },
    /// Show counters per database and per device.
    Stats,
}

/// How to settle a process in doubt.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum Outcome {
    /// Replies go to their devices, PROCESSED messages to `Log`.
    Commit,
    /// Replies are deleted, the messages go back to `Messages`.
    Rollback,
}

/// `admin enterprise …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum EnterpriseCommand {
    /// Create an enterprise.
    Create {
        /// The new enterprise's id.
        id: Id,
    },
    /// List enterprises, one page at a time.
    List {
        /// The page.
        #[command(flatten)]
        page: PageArgs,
    },
    /// Show an enterprise: its subsystems, how many databases and devices.
    Show {
        /// The enterprise.
        id: Id,
    },
    /// Delete an enterprise that has no subsystems, databases or devices.
    Delete {
        /// The enterprise.
        id: Id,
    },
}

/// `admin subsystem …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum SubsystemCommand {
    /// Create a subsystem of an enterprise.
    Create {
        /// The enterprise.
        enterprise: Id,
        /// The new subsystem's id.
        id: Id,
    },
    /// List the subsystems of an enterprise.
    List {
        /// The enterprise.
        enterprise: Id,
    },
    /// Delete a subsystem that no device runs.
    Delete {
        /// The enterprise.
        enterprise: Id,
        /// The subsystem.
        id: Id,
    },
}

/// `admin database create`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct DatabaseCreate {
    /// The enterprise.
    enterprise: Id,
    /// The new database's id.
    id: Id,
}

/// `admin device create`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct DeviceCreate {
    /// The enterprise.
    enterprise: Id,
    /// The new device's id.
    id: Id,
    /// The subsystem (mobile application) the device runs.
    #[arg(long)]
    subsystem: Id,
}

/// `admin database …` and `admin device …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum EndpointCommand<C: clap::Args> {
    /// Create one; prints its token (shown once).
    Create {
        /// What to create.
        #[command(flatten)]
        create: C,
    },
    /// List them, one page at a time.
    List {
        /// Only those of this enterprise.
        #[arg(long)]
        enterprise: Option<Id>,
        /// The page.
        #[command(flatten)]
        page: PageArgs,
    },
    /// Show one: its folders' file counts and open processes.
    Show {
        /// Its id.
        id: Id,
    },
    /// Delete one and its mailbox; refused while messages wait (besides
    /// `Log`) or a process is open, unless forced.
    Delete {
        /// Its id.
        id: Id,
        /// Delete anyway: abort its live process, roll back those in doubt,
        /// and discard every message of its mailbox.
        #[arg(long)]
        force: bool,
    },
    /// Give it a new token (printed once); the old one stops working at once.
    RotateToken {
        /// Its id.
        id: Id,
    },
}

/// `admin token …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum TokenCommand {
    /// Replace the admin token without a restart; prints the new one (shown
    /// once). Refused when ESTAFETA_ADMIN_TOKEN sets the server's token.
    Rotate,
}

/// `admin message …`: a message of `Unknown` or `Error`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum MessageCommand {
    /// Print the message.
    Show {
        /// Where it is.
        #[command(flatten)]
        at: MessageArgs,
    },
    /// Move it into its recipient's `Messages`, to be handed out again.
    Requeue {
        /// Where it is.
        #[command(flatten)]
        at: MessageArgs,
    },
    /// Delete it for good.
    Discard {
        /// Where it is.
        #[command(flatten)]
        at: MessageArgs,
    },
}

/// A message of a mailbox's `Unknown` or `Error`.
#[derive(Debug, clap::Args)]
pub(crate) struct MessageArgs {
    /// The database or device whose mailbox holds it.
    mailbox: Id,
    /// Unknown or Error.
    #[arg(value_parser = parse_folder)]
    folder: Folder,
    /// The message id.
    id: MessageId,
}

/// One page of a list.
#[derive(Debug, clap::Args)]
pub(crate) struct PageArgs {
    /// How many at most (1–1000; the server's default is 100).
    #[arg(long)]
    limit: Option<usize>,
    /// Start after this id (the previous page's `next_after`).
    #[arg(long)]
    after: Option<Id>,
}

fn parse_folder(text: &str) -> Result<Folder, String> {
    Folder::from_name(text).ok_or_else(|| {
        format!("unknown folder {text:?}: one of Messages, Prepared, Log, Unknown, Error")
    })
}

/// An admin command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OperatorError {
    /// The call failed (transport, or the server's error answer).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The answer could not be printed.
    #[error("printing the answer failed: {0}")]
    Print(#[from] serde_json::Error),
}

/// What a command prints: its answer, and a warning for the operator.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The server's answer as pretty JSON (stdout).
    pub(crate) json: String,
    /// Something the operator must know (stderr), e.g. what a forced
    /// delete discarded.
    pub(crate) warning: Option<String>,
}

/// Runs the command against the server.
pub(crate) async fn execute(args: &AdminArgs) -> Result<Answer, OperatorError> {
    let client = Client::new(&args.url, &args.token)?;
    let json = match &args.command {
        AdminCommand::Enterprise { command } => match command {
            EnterpriseCommand::Create { id } => pretty(&client.create_enterprise(id).await?),
            EnterpriseCommand::List { page } => {
                pretty(&client.enterprises(page.limit, page.after.as_ref()).await?)
            }
            EnterpriseCommand::Show { id } => pretty(&client.enterprise(id).await?),
            EnterpriseCommand::Delete { id } => pretty(&client.delete_enterprise(id).await?),
        },
        AdminCommand::Subsystem { command } => match command {
            SubsystemCommand::Create { enterprise, id } => {
                pretty(&client.create_subsystem(enterprise, id).await?)
            }
            SubsystemCommand::List { enterprise } => pretty(&client.subsystems(enterprise).await?),
            SubsystemCommand::Delete { enterprise, id } => {
                pretty(&client.delete_subsystem(enterprise, id).await?)
            }
        },
        AdminCommand::Database { command } => match command {
            EndpointCommand::Create {
                create: DatabaseCreate { enterprise, id },
            } => pretty(&client.create_database(enterprise, id).await?),
            EndpointCommand::List { enterprise, page } => pretty(
                &client
                    .databases(page.limit, page.after.as_ref(), enterprise.as_ref())
                    .await?,
            ),
            EndpointCommand::Show { id } => pretty(&client.database(id).await?),
            EndpointCommand::Delete { id, force } => {
                return deleted(client.delete_database(id, *force).await?, "database");
            }
            EndpointCommand::RotateToken { id } => pretty(&client.rotate_database_token(id).await?),
        },
        AdminCommand::Device { command } => match command {
            EndpointCommand::Create {
                create:
                    DeviceCreate {
                        enterprise,
                        id,
                        subsystem,
                    },
            } => pretty(&client.create_device(enterprise, id, subsystem).await?),
            EndpointCommand::List { enterprise, page } => pretty(
                &client
                    .devices(page.limit, page.after.as_ref(), enterprise.as_ref())
                    .await?,
            ),
            EndpointCommand::Show { id } => pretty(&client.device(id).await?),
            EndpointCommand::Delete { id, force } => {
                return deleted(client.delete_device(id, *force).await?, "device");
            }
            EndpointCommand::RotateToken { id } => pretty(&client.rotate_device_token(id).await?),
        },
        AdminCommand::Token {
            command: TokenCommand::Rotate,
        } => {
            let answer = client.rotate_admin_token().await?;
            return Ok(Answer {
                json: pretty(&answer)?,
                warning: Some(
                    "the old admin token no longer works; keep the new one: it is not shown again"
                        .to_owned(),
                ),
            });
        }
        AdminCommand::Processes => pretty(&client.processes().await?),
        AdminCommand::Settle { pid, outcome } => {
            let outcome = match outcome {
                Outcome::Commit => Settlement::Commit,
                Outcome::Rollback => Settlement::Rollback,
            };
            pretty(&client.settle(pid, outcome).await?)
        }
        AdminCommand::Folder { mailbox, folder } => pretty(&client.folder(mailbox, *folder).await?),
        AdminCommand::Message { command } => match command {
            MessageCommand::Show { at } => {
                pretty(&client.message(&at.mailbox, at.folder, &at.id).await?)
            }
            MessageCommand::Requeue { at } => {
                pretty(&client.requeue(&at.mailbox, at.folder, &at.id).await?)
            }
            MessageCommand::Discard { at } => {
                pretty(&client.discard(&at.mailbox, at.folder, &at.id).await?)
            }
        },
        AdminCommand::Stats => pretty(&client.stats().await?),
    }?;
    Ok(Answer {
        json,
        warning: None,
    })
}

/// A delete's answer, with a warning when it was forced.
fn deleted(answer: Deleted, kind: &str) -> Result<Answer, OperatorError> {
    let warning = answer.forced.then(|| {
        format!(
            "forced delete of {kind} {}: {} message files discarded for good, {} open processes ended",
            answer.id,
            answer.discarded,
            answer.ended_processes.len()
        )
    });
    Ok(Answer {
        json: pretty(&answer)?,
        warning,
    })
}

fn pretty<T: Serialize>(value: &T) -> Result<String, OperatorError> {
    Ok(serde_json::to_string_pretty(value)?)
}
