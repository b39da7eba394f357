//! A typed async client for the Estafeta HTTP API (version 1).
//!
//! [`Client`] has one method per call of the API; request and answer bodies
//! are the types of [`estafeta_wire`], which the server parses and answers
//! with too, so the client and the server cannot disagree about a field;
//! nothing else of the server's comes along (no storage, no SQLite, no CLI).
//! Status words (`IDLE`, `BUSY`, `OK`, `CANCELLED`, `FAILED`) are values in
//! the answers, not errors: an `Err` is always a failed transport or an HTTP
//! error answer ([`ClientError`]), and the latter carries the status and the
//! server's error code and message.
//!
//! The simulated processor and device built on it, and the fault-injection
//! harness, are in the `estafeta-sim` and `estafeta-faults` crates.
//!
//! # Example
//!
//! An administrator provisions a database and a device; the device uploads a
//! message, and the database's processor starts a process that receives it:
//!
//! ```no_run
//! use estafeta_client::Client;
//! use estafeta_wire::{Body, Id, SendMessage, StartRequest, StartStatus};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let admin = Client::new("http://127.0.0.1:8080", "the-admin-token")?;
//! let acme: Id = "acme".parse()?;
//! admin.create_enterprise(&acme).await?;
//! admin.create_subsystem(&acme, &"sales".parse()?).await?;
//! let db = admin.create_database(&acme, &"db-a".parse()?).await?;
//! let phone = admin.create_device(&acme, &"phone-1".parse()?, &"sales".parse()?).await?;
//!
//! let device = admin.with_token(&phone.token);
//! let order = SendMessage::new(db.id.clone(), Body::from_json(r#"{"order": 17}"#)?);
//! let sent = device.send(&order.with_key("order-17")).await?;
//! println!("message {} ({:?})", sent.accepted.id, sent.upload);
//!
//! let processor = admin.with_token(&db.token);
//! let started = processor.start(&StartRequest::new(db.id.clone())).await?;
//! assert_eq!(started.status, StartStatus::Ok);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod error;

pub use error::ClientError;
pub use estafeta_wire::Upload;

use estafeta_wire::{
    AbortRequest, AcceptRequest, AckRequest, AckResponse, AlertList, CallResponse, CommitRequest,
    CreateDatabase, CreateDevice, CreateEnterprise, CreateSubsystem, Credentials, ErrorBody,
    Folder, FolderListing, Id, Inbox, MessageAccepted, MessageId, PrepareRequest, ProcessId,
    ProcessList, ProcessStatus, RollbackRequest, SendMessage, StartRequest, StartResponse, Stats,
    Version,
};
use estafeta_wire::{
    AdminCredentials, DatabaseList, Deleted, DeviceList, EndpointDetail, EnterpriseDetail,
    EnterpriseList, HandSettled, Message, SettleRequest, Settlement, SubsystemList,
};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The answer to an upload: the message's id and whether it is new (201) or
/// the earlier message of the same idempotency key (200).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The message id.
    pub accepted: MessageAccepted,
    /// Created now or repeated.
    pub upload: Upload,
}

/// A connection to one Estafeta server with one bearer token. Cheap to
/// clone; clones share the connection pool.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    /// The base URL without a trailing slash.
    base: String,
    token: String,
}

impl Client {
    /// A client for the server at `base_url` (e.g. `http://127.0.0.1:8080`)
    /// that authenticates with `token` (admin, database or device).
    pub fn new(base_url: &str, token: &str) -> Result<Client, ClientError> {
        Self::from_reqwest(base_url, token, reqwest::Client::builder().build()?)
    }

    /// Like [`Client::new`], but every call fails with a transport error
    /// when it has no complete answer within `timeout` (a hung or paused
    /// server, a proxy that holds a request): what a processor needs to give
    /// up on a call as the protocol tells it to.
    pub fn with_timeout(
        base_url: &str,
        token: &str,
        timeout: std::time::Duration,
    ) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        Self::from_reqwest(base_url, token, http)
    }

    /// A client on an HTTP client the caller configured (timeouts, pool),
    /// e.g. one that keeps no idle connection so that a fault injected on
    /// one connection touches one call.
    pub fn from_reqwest(
        base_url: &str,
        token: &str,
        http: reqwest::Client,
    ) -> Result<Client, ClientError> {
        reqwest::Url::parse(base_url).map_err(|e| ClientError::BadUrl {
            url: base_url.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Client {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        })
    }

    /// The same server and connection pool with another token (e.g. the
    /// admin client turned into a device's client).
    pub fn with_token(&self, token: &str) -> Client {
        Client {
            http: self.http.clone(),
            base: self.base.clone(),
            token: token.to_owned(),
        }
    }

    /// The base URL this client talks to.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    // Operations.

    /// `GET /healthz`: Ok while the server process runs.
    pub async fn healthz(&self) -> Result<(), ClientError> {
        let resp = self.request(Method::GET, "/healthz").send().await?;
        expect_empty(resp).await
    }

    /// `GET /readyz`: true once start-up recovery is done, false while the
    /// server answers 503 (recovering or stopping).
    pub async fn readyz(&self) -> Result<bool, ClientError> {
        let resp = self.request(Method::GET, "/readyz").send().await?;
        if resp.status() == StatusCode::SERVICE_UNAVAILABLE {
            return Ok(false);
        }
        expect_empty(resp).await.map(|()| true)
    }

    /// `GET /metrics`: the Prometheus text.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let resp = self.request(Method::GET, "/metrics").send().await?;
        let resp = check(resp).await?;
        Ok(resp.text().await?)
    }

    /// How many messages the server keeps scheduled for later
    /// (`deliver_at`), from its metrics; `None` if they do not say.
    pub async fn scheduled_messages(&self) -> Result<Option<u64>, ClientError> {
        Ok(scheduled_in(&self.metrics().await?))
    }

    /// `GET /v1/openapi.json`: the OpenAPI document.
    pub async fn openapi(&self) -> Result<serde_json::Value, ClientError> {
        self.get("/v1/openapi.json").await
    }

    // Administration (admin token).

    /// `POST /v1/admin/enterprises` (201; 409 if it exists).
    pub async fn create_enterprise(&self, id: &Id) -> Result<CreateEnterprise, ClientError> {
        let body = CreateEnterprise {
            version: Version,
            id: id.clone(),
        };
        self.post("/v1/admin/enterprises", &body).await
    }

    /// `POST /v1/admin/enterprises/{ent}/subsystems`.
    pub async fn create_subsystem(
        &self,
        enterprise: &Id,
        id: &Id,
    ) -> Result<CreateSubsystem, ClientError> {
        let body = CreateSubsystem {
            version: Version,
            id: id.clone(),
        };
        let path = format!("/v1/admin/enterprises/{enterprise}/subsystems");
        self.post(&path, &body).await
    }

    /// `POST /v1/admin/enterprises/{ent}/databases`: the database's token.
    pub async fn create_database(
        &self,
        enterprise: &Id,
        id: &Id,
    ) -> Result<Credentials, ClientError> {
        let body = CreateDatabase {
            version: Version,
            id: id.clone(),
        };
        let path = format!("/v1/admin/enterprises/{enterprise}/databases");
        self.post(&path, &body).await
    }

    /// `POST /v1/admin/enterprises/{ent}/devices`: the device's token.
    pub async fn create_device(
        &self,
        enterprise: &Id,
        id: &Id,
        subsystem: &Id,
    ) -> Result<Credentials, ClientError> {
        let body = CreateDevice {
            version: Version,
            id: id.clone(),
            subsystem: subsystem.clone(),
        };
        let path = format!("/v1/admin/enterprises/{enterprise}/devices");
        self.post(&path, &body).await
    }

    /// `GET /v1/admin/processes`.
    pub async fn processes(&self) -> Result<ProcessList, ClientError> {
        self.get("/v1/admin/processes").await
    }

    /// `GET /v1/admin/alerts`: every alert raised, newest first.
    pub async fn alerts(&self) -> Result<AlertList, ClientError> {
        self.get("/v1/admin/alerts").await
    }

    /// `GET /v1/admin/stats`.
    pub async fn stats(&self) -> Result<Stats, ClientError> {
        self.get("/v1/admin/stats").await
    }

    /// `GET /v1/admin/databases/{db}/folders/{folder}`.
    pub async fn folder(&self, mailbox: &Id, folder: Folder) -> Result<FolderListing, ClientError> {
        self.get(&format!("/v1/admin/databases/{mailbox}/folders/{folder}"))
            .await
    }

    /// `GET /v1/admin/enterprises?limit=&after=`: one page of enterprises.
    pub async fn enterprises(
        &self,
        limit: Option<usize>,
        after: Option<&Id>,
    ) -> Result<EnterpriseList, ClientError> {
        self.get(&paged("/v1/admin/enterprises", limit, after, None))
            .await
    }

    /// `GET /v1/admin/enterprises/{ent}`.
    pub async fn enterprise(&self, id: &Id) -> Result<EnterpriseDetail, ClientError> {
        self.get(&format!("/v1/admin/enterprises/{id}")).await
    }

    /// `DELETE /v1/admin/enterprises/{ent}`: refused while it has members.
    pub async fn delete_enterprise(&self, id: &Id) -> Result<CreateEnterprise, ClientError> {
        self.delete(&format!("/v1/admin/enterprises/{id}")).await
    }

    /// `GET /v1/admin/enterprises/{ent}/subsystems`.
    pub async fn subsystems(&self, enterprise: &Id) -> Result<SubsystemList, ClientError> {
        self.get(&format!("/v1/admin/enterprises/{enterprise}/subsystems"))
            .await
    }

    /// `DELETE /v1/admin/enterprises/{ent}/subsystems/{sub}`: refused while devices run it.
    pub async fn delete_subsystem(
        &self,
        enterprise: &Id,
        id: &Id,
    ) -> Result<CreateSubsystem, ClientError> {
        self.delete(&format!(
            "/v1/admin/enterprises/{enterprise}/subsystems/{id}"
        ))
        .await
    }

    /// `GET /v1/admin/databases?limit=&after=&enterprise=`: one page of databases.
    pub async fn databases(
        &self,
        limit: Option<usize>,
        after: Option<&Id>,
        enterprise: Option<&Id>,
    ) -> Result<DatabaseList, ClientError> {
        self.get(&paged("/v1/admin/databases", limit, after, enterprise))
            .await
    }

    /// `GET /v1/admin/devices?limit=&after=&enterprise=`: one page of devices.
    pub async fn devices(
        &self,
        limit: Option<usize>,
        after: Option<&Id>,
        enterprise: Option<&Id>,
    ) -> Result<DeviceList, ClientError> {
        self.get(&paged("/v1/admin/devices", limit, after, enterprise))
            .await
    }

    /// `GET /v1/admin/databases/{db}`.
    pub async fn database(&self, id: &Id) -> Result<EndpointDetail, ClientError> {
        self.get(&format!("/v1/admin/databases/{id}")).await
    }

    /// `GET /v1/admin/devices/{dev}`.
    pub async fn device(&self, id: &Id) -> Result<EndpointDetail, ClientError> {
        self.get(&format!("/v1/admin/devices/{id}")).await
    }

    /// `DELETE /v1/admin/databases/{db}[?force=true]`.
    pub async fn delete_database(&self, id: &Id, force: bool) -> Result<Deleted, ClientError> {
        self.delete(&format!("/v1/admin/databases/{id}?force={force}"))
            .await
    }

    /// `DELETE /v1/admin/devices/{dev}[?force=true]`.
    pub async fn delete_device(&self, id: &Id, force: bool) -> Result<Deleted, ClientError> {
        self.delete(&format!("/v1/admin/devices/{id}?force={force}"))
            .await
    }

    /// `POST /v1/admin/databases/{db}/token`: a new token, shown once.
    pub async fn rotate_database_token(&self, id: &Id) -> Result<Credentials, ClientError> {
        self.post(&format!("/v1/admin/databases/{id}/token"), &())
            .await
    }

    /// `POST /v1/admin/devices/{dev}/token`: a new token, shown once.
    pub async fn rotate_device_token(&self, id: &Id) -> Result<Credentials, ClientError> {
        self.post(&format!("/v1/admin/devices/{id}/token"), &())
            .await
    }

    /// `POST /v1/admin/token`: a new admin token, shown once.
    pub async fn rotate_admin_token(&self) -> Result<AdminCredentials, ClientError> {
        self.post("/v1/admin/token", &()).await
    }

    /// `POST /v1/admin/processes/{pid}/settle`: settle a process in doubt.
    pub async fn settle(
        &self,
        pid: &ProcessId,
        outcome: Settlement,
    ) -> Result<CallResponse, ClientError> {
        let body = SettleRequest {
            version: Version,
            outcome,
        };
        self.post(&format!("/v1/admin/processes/{pid}/settle"), &body)
            .await
    }

    /// `GET /v1/admin/databases/{db}/folders/{folder}/{id}`: a message of
    /// `Unknown` or `Error`.
    pub async fn message(
        &self,
        mailbox: &Id,
        folder: Folder,
        id: &MessageId,
    ) -> Result<Message, ClientError> {
        self.get(&format!(
            "/v1/admin/databases/{mailbox}/folders/{folder}/{id}"
        ))
        .await
    }

    /// `POST /v1/admin/databases/{db}/folders/{folder}/{id}/requeue`.
    pub async fn requeue(
        &self,
        mailbox: &Id,
        folder: Folder,
        id: &MessageId,
    ) -> Result<HandSettled, ClientError> {
        let path = format!("/v1/admin/databases/{mailbox}/folders/{folder}/{id}/requeue");
        self.post(&path, &()).await
    }

    /// `POST /v1/admin/databases/{db}/folders/{folder}/{id}/discard`.
    pub async fn discard(
        &self,
        mailbox: &Id,
        folder: Folder,
        id: &MessageId,
    ) -> Result<HandSettled, ClientError> {
        let path = format!("/v1/admin/databases/{mailbox}/folders/{folder}/{id}/discard");
        self.post(&path, &()).await
    }

    // Devices (device token).

    /// `POST /v1/messages`: upload a message; returns once it is durable.
    pub async fn send(&self, message: &SendMessage) -> Result<Sent, ClientError> {
        let resp = self
            .request(Method::POST, "/v1/messages")
            .json(message)
            .send()
            .await?;
        let upload = match resp.status() {
            StatusCode::CREATED => Upload::Created,
            _ => Upload::Repeated,
        };
        let accepted = decode(resp).await?;
        Ok(Sent { accepted, upload })
    }

    /// `GET /v1/inbox?limit=N`: unacknowledged messages, oldest first.
    pub async fn inbox(&self, limit: Option<usize>) -> Result<Inbox, ClientError> {
        match limit {
            Some(n) => self.get(&format!("/v1/inbox?limit={n}")).await,
            None => self.get("/v1/inbox").await,
        }
    }

    /// `POST /v1/inbox/ack`: acknowledge messages; how many were acknowledged now.
    pub async fn ack(&self, ids: &[MessageId]) -> Result<AckResponse, ClientError> {
        let body = AckRequest {
            version: Version,
            ids: ids.to_vec(),
        };
        self.post("/v1/inbox/ack", &body).await
    }

    // Processors (database token).

    /// API_1, `POST /v1/processes`: IDLE, BUSY or OK with messages.
    pub async fn start(&self, request: &StartRequest) -> Result<StartResponse, ClientError> {
        self.post("/v1/processes", request).await
    }

    /// API_2, `POST /v1/processes/{pid}/accept`: narrow the list.
    pub async fn accept(
        &self,
        pid: &ProcessId,
        message_ids: &[MessageId],
    ) -> Result<CallResponse, ClientError> {
        let body = AcceptRequest {
            version: Version,
            message_ids: message_ids.to_vec(),
        };
        self.post(&format!("/v1/processes/{pid}/accept"), &body)
            .await
    }

    /// API_3, `POST /v1/processes/{pid}/prepare`: verdicts and replies.
    pub async fn prepare(
        &self,
        pid: &ProcessId,
        request: &PrepareRequest,
    ) -> Result<CallResponse, ClientError> {
        self.post(&format!("/v1/processes/{pid}/prepare"), request)
            .await
    }

    /// API_4, `POST /v1/processes/{pid}/commit`: the processor committed.
    pub async fn commit(&self, pid: &ProcessId) -> Result<CallResponse, ClientError> {
        let body = CommitRequest { version: Version };
        self.post(&format!("/v1/processes/{pid}/commit"), &body)
            .await
    }

    /// API_5, `POST /v1/processes/{pid}/rollback`: the processor's commit failed.
    pub async fn rollback(
        &self,
        pid: &ProcessId,
        error_text: &str,
    ) -> Result<CallResponse, ClientError> {
        let body = RollbackRequest {
            version: Version,
            error_text: error_text.to_owned(),
        };
        self.post(&format!("/v1/processes/{pid}/rollback"), &body)
            .await
    }

    /// API_6, `POST /v1/processes/{pid}/abort`: the processor gives up.
    pub async fn abort(&self, pid: &ProcessId, message: &str) -> Result<CallResponse, ClientError> {
        let body = AbortRequest {
            version: Version,
            message: message.to_owned(),
        };
        self.post(&format!("/v1/processes/{pid}/abort"), &body)
            .await
    }

    /// `GET /v1/processes/{pid}`: the process's state.
    pub async fn process(&self, pid: &ProcessId) -> Result<ProcessStatus, ClientError> {
        self.get(&format!("/v1/processes/{pid}")).await
    }

    // Plumbing.

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let builder = self.http.request(method, format!("{}{path}", self.base));
        if self.token.is_empty() {
            builder
        } else {
            builder.bearer_auth(&self.token)
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        decode(self.request(Method::GET, path).send().await?).await
    }

    async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        decode(self.request(Method::DELETE, path).send().await?).await
    }

    async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        decode(self.request(Method::POST, path).json(body).send().await?).await
    }
}

/// `path` with the paging query (ids need no escaping: they are URL-safe).
fn paged(path: &str, limit: Option<usize>, after: Option<&Id>, enterprise: Option<&Id>) -> String {
    let mut query = Vec::new();
    if let Some(n) = limit {
        query.push(format!("limit={n}"));
    }
    if let Some(a) = after {
        query.push(format!("after={a}"));
    }
    if let Some(e) = enterprise {
        query.push(format!("enterprise={e}"));
    }
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", query.join("&"))
    }
}

/// Turns an HTTP error answer into [`ClientError::Api`]; passes success through.
async fn check(resp: Response) -> Result<Response, ClientError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let text = resp.text().await?;
    let (code, message) = match serde_json::from_str::<ErrorBody>(&text) {
        Ok(body) => (body.error.code, body.error.message),
        // Not the server's error JSON (a proxy, or a server of another kind):
        // keep what it said so the caller can see it.
        Err(_) => (format!("http_{}", status.as_u16()), text),
    };
    Err(ClientError::Api {
        status,
        code,
        message,
        retry_after,
    })
}

/// The typed body of a successful answer.
async fn decode<T: DeserializeOwned>(resp: Response) -> Result<T, ClientError> {
    let resp = check(resp).await?;
    let status = resp.status();
    let bytes = resp.bytes().await?;
    serde_json::from_slice(&bytes).map_err(|e| ClientError::BadAnswer {
        status,
        reason: e.to_string(),
    })
}

/// A successful answer whose body does not matter.
async fn expect_empty(resp: Response) -> Result<(), ClientError> {
    check(resp).await.map(drop)
}

/// The scheduled messages' gauge in the Prometheus text `metrics`.
fn scheduled_in(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("estafeta_repeat_entries{source=\"deliver_at\"} "))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_is_checked_and_trimmed() {
        assert!(matches!(
            Client::new("not a url", "t"),
            Err(ClientError::BadUrl { .. })
        ));
        let c = Client::new("http://127.0.0.1:1/", "t").unwrap();
        assert_eq!(c.base_url(), "http://127.0.0.1:1");
        assert_eq!(c.with_token("u").base_url(), "http://127.0.0.1:1");
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_transport_error() {
        // A port that was just free and is closed again.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let c = Client::new(&format!("http://127.0.0.1:{port}"), "t").unwrap();
        let err = c.healthz().await.unwrap_err();
        assert!(matches!(err, ClientError::Transport(_)), "{err}");
        assert_eq!(err.status(), None);
    }

    #[test]
    fn the_scheduled_gauge_is_read_from_the_metrics() {
        let metrics = "# TYPE estafeta_repeat_entries gauge\n\
            estafeta_repeat_entries{source=\"alerts\"} 7\n\
            estafeta_repeat_entries{source=\"deliver_at\"} 3\n";
        assert_eq!(scheduled_in(metrics), Some(3));
        assert_eq!(scheduled_in("estafeta_up 1\n"), None);
    }
}
