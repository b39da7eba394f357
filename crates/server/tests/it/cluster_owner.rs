//! Cluster mode: a started process's owner record (which database it
//! belongs to, what `GET /v1/processes/{pid}` reads first) is durable
//! before `start` answers. No start-up processing of a shared store writes
//! it again, so a node killed right after answering must not lose it: the
//! test holds its save back in the database (a trigger that waits) and
//! looks for it as soon as the answer is in.

use crate::common::{Store, Tenancy, TestServer, message, start_ok};

/// Makes every save of a process's record wait two seconds in the
/// database before it goes through.
async fn slow_process_saves(db: &estafeta_postgres::Store) {
    let client = db.client().await.unwrap();
    client
        .batch_execute(
            "CREATE FUNCTION slow_save() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$;
             CREATE TRIGGER slow_process_saves BEFORE INSERT OR UPDATE ON sessions FOR EACH ROW
               WHEN (substring(NEW.key from 1 for 4) = 'pid/'::bytea AND NEW.record IS NOT NULL)
               EXECUTE FUNCTION slow_save()",
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_process_is_findable_as_soon_as_start_answers() {
    let server = TestServer::start_on(Store::Postgres).await;
    let db = estafeta_postgres::Store::connect(server.store.as_deref().unwrap()).unwrap();
    let t = Tenancy::provision(&server.admin).await;
    t.phone1
        .send(&message("db-a", r#"{"n":1}"#, None))
        .await
        .unwrap();
    slow_process_saves(&db).await;

    let started = start_ok(&t.db_a, "db-a").await;
    let pid = started.process_id.unwrap();
    let client = db.client().await.unwrap();
    let stored: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM sessions WHERE key = $1 AND record IS NOT NULL)",
            &[&format!("pid/{pid}").into_bytes()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(stored, "the owner record of {pid} is not durable");
    assert_eq!(t.db_a.process(&pid).await.unwrap().db_id.as_str(), "db-a");
}
