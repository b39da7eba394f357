//! A small tour of the session engine on its default redb storage: many
//! tasks increment counters on a few keys, each release durable, and the
//! engine's figures are printed (note the group-commit factor).
//!
//! `cargo run --release -p estafeta-session --example counter [data.redb]`

use estafeta_session::{Engine, RedbStorage};
use std::sync::Arc;
use std::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "estafeta-session-example.redb".into());
    let engine: Engine<String, u64> = Engine::builder(Arc::new(RedbStorage::open(&path)?))
        .open()
        .await?;
    let started = Instant::now();
    let tasks: Vec<_> = (0..2000)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let mut s = engine
                    .get(format!("counter-{}", i % 16), true)
                    .await?
                    .ok_or("absent")?;
                *s.persistent_mut() += 1;
                s.release().await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    for t in tasks {
        t.await?.map_err(|e| e.to_string())?;
    }
    let total: u64 = {
        let mut sum = 0;
        for k in 0..16 {
            if let Some(s) = engine.get(format!("counter-{k}"), false).await? {
                sum += *s.state();
            }
        }
        sum
    };
    let stats = engine.stats();
    println!(
        "counters in {path}: total {total} after this run ({:?})",
        started.elapsed()
    );
    println!(
        "saves {} in {} durable transactions ({:.1} saves per fsync)",
        stats.saves,
        stats.save_batches,
        stats.saves as f64 / stats.save_batches.max(1) as f64
    );
    engine.stop().await?;
    Ok(())
}
