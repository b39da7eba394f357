//! Shared harness for the engine's integration tests: a recording set of
//! hooks and engine constructors over memory or redb storage.

use estafeta_session::{
    BoxFuture, Config, Engine, Finalize, Hooks, MemoryStorage, SessionData, Storage, Timestamp,
    TokioClock,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A session state with a counter and a note.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Counter {
    pub(crate) n: u64,
    pub(crate) note: String,
}

/// What the finalize hook does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OnExpire {
    End,
    /// Keep it, extending its life by this much.
    Extend(Duration),
}

/// Hooks that record every notification.
pub(crate) struct Recorder {
    pub(crate) begins: Mutex<Vec<(String, Counter)>>,
    pub(crate) ends: Mutex<Vec<(String, Counter)>>,
    pub(crate) finalized: Mutex<Vec<String>>,
    pub(crate) first_loads: Mutex<Vec<(String, Counter)>>,
    pub(crate) on_expire: Mutex<OnExpire>,
}

impl Recorder {
    pub(crate) fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            begins: Mutex::new(Vec::new()),
            ends: Mutex::new(Vec::new()),
            finalized: Mutex::new(Vec::new()),
            first_loads: Mutex::new(Vec::new()),
            on_expire: Mutex::new(OnExpire::End),
        })
    }
    pub(crate) fn ends(&self) -> Vec<(String, Counter)> {
        self.ends.lock().unwrap().clone()
    }
    pub(crate) fn begins(&self) -> Vec<(String, Counter)> {
        self.begins.lock().unwrap().clone()
    }
}

impl Hooks<String, Counter> for Recorder {
    fn begin(&self, key: &String, state: &Counter) {
        self.begins
            .lock()
            .unwrap()
            .push((key.clone(), state.clone()));
    }
    fn end(&self, key: &String, state: &Counter) {
        self.ends.lock().unwrap().push((key.clone(), state.clone()));
    }
    fn finalize<'a>(
        &'a self,
        key: &'a String,
        s: &'a mut SessionData<Counter>,
        _step: Option<&'a mut dyn estafeta_session::Step>,
    ) -> BoxFuture<'a, Finalize> {
        Box::pin(async move {
            self.finalized.lock().unwrap().push(key.clone());
            let on_expire = *self.on_expire.lock().unwrap();
            match on_expire {
                OnExpire::End => Finalize::End,
                OnExpire::Extend(d) => {
                    s.persistent_mut().note = "finalized".into();
                    let at = s.expires_at().unwrap_or(Timestamp(0)).after(d);
                    s.set_expires_at(Some(at));
                    Finalize::Keep
                }
            }
        })
    }
    fn first_load<'a>(
        &'a self,
        key: &'a String,
        s: &'a mut SessionData<Counter>,
    ) -> BoxFuture<'a, Finalize> {
        Box::pin(async move {
            self.first_loads
                .lock()
                .unwrap()
                .push((key.clone(), s.state().clone()));
            Finalize::Keep
        })
    }
}

/// The wall-clock start of every test clock.
pub(crate) const T0: Timestamp = Timestamp(1_800_000_000_000);

/// An engine on `storage` with the recorder, a tokio-driven clock and `config`.
pub(crate) async fn engine_with(
    storage: Arc<dyn Storage>,
    hooks: Arc<Recorder>,
    config: Config,
) -> Engine<String, Counter> {
    Engine::builder(storage)
        .clock(Arc::new(TokioClock::starting_at(T0)))
        .hooks(hooks)
        .config(config)
        .open()
        .await
        .expect("engine opens")
}

/// An engine over fresh memory storage.
pub(crate) async fn memory_engine() -> (Engine<String, Counter>, Arc<MemoryStorage>, Arc<Recorder>)
{
    let storage = Arc::new(MemoryStorage::new());
    let hooks = Recorder::new();
    let engine = engine_with(storage.clone(), hooks.clone(), Config::default()).await;
    (engine, storage, hooks)
}

/// Increment the counter of `key` persistently, creating it if needed.
pub(crate) async fn bump(engine: &Engine<String, Counter>, key: &str) -> u64 {
    let mut s = engine.get(key.to_string(), true).await.unwrap().unwrap();
    s.persistent_mut().n += 1;
    let n = s.state().n;
    s.release().await.unwrap();
    n
}

/// Read the counter of `key` without creating it.
pub(crate) async fn read(engine: &Engine<String, Counter>, key: &str) -> Option<Counter> {
    let s = engine.get(key.to_string(), false).await.unwrap()?;
    let c = s.state().clone();
    s.release().await.unwrap();
    Some(c)
}

/// Let every ready task run (the expiry manager, background saves).
pub(crate) async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}
