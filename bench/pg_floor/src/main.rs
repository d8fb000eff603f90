//! The least a PostgreSQL lock runner does, to measure the floor under `dlock run` on PostgreSQL
//! (bench/README.md): a TCP connection, libpq's `SSLRequest` (answered `N` on a server without
//! TLS, as dlock's default `sslmode=prefer` sends it), the start-up, one statement that takes a
//! session advisory lock, the command spawned and waited for, the unlock, exit; with more in
//! the lock's and the unlock's statements as MODE says ([`statements`]): what a fencing token,
//! a holder record and a run history cost a new session at the least. `setup` creates the
//! tables (once, before measuring).
//!
//! Usage: pg-floor HOST PORT USER DB setup|lock[+fence|+seq][+holder][+runs|+heap] CMD [ARG...]

use std::process::{Command, ExitCode};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The lock's statement and the unlock's for MODE: `lock`, then any of `+fence` (a per-key
/// counter bumped and returned) or `+seq` (a token from one sequence instead), `+holder` (a
/// holder row upserted with the lock and deleted with the unlock), `+runs` (a start inserted with the lock and an end with the unlock, in
/// a table shaped as dlock's history: an identity primary key and a `(key, id)` index) or
/// `+heap` (the same in a table with no index at all).
fn statements(mode: &str) -> (String, String) {
    let mut parts = mode.split('+');
    assert_eq!(parts.next(), Some("lock"), "a mode starts with lock");
    let (mut ctes, mut ends): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    let mut fence = "0".to_owned();
    for part in parts {
        match part {
            "fence" => {
                ctes.push(
                    "f AS (INSERT INTO floor_fences VALUES (4242, 1) ON CONFLICT (id) \
                    DO UPDATE SET fence = floor_fences.fence + 1 RETURNING fence)"
                        .to_owned(),
                );
                fence = "(SELECT fence FROM f)".to_owned();
            }
            "seq" => fence = "nextval('floor_seq')".to_owned(),
            "holder" => {
                // dlock's release removes its holder record with the unlock.
                ends.push(
                    "h AS (DELETE FROM floor_holders WHERE pid = pg_backend_pid())".to_owned(),
                );
                ctes.push(
                    "h AS (INSERT INTO floor_holders VALUES (pg_backend_pid(), 4242, 'x') \
                ON CONFLICT (pid) DO UPDATE SET holder = EXCLUDED.holder)"
                        .to_owned(),
                );
            }
            "runs" | "heap" => {
                let table = format!("floor_{part}");
                for (kind, into) in [("start", &mut ctes), ("end", &mut ends)] {
                    into.push(format!(
                        "{kind}_row AS (INSERT INTO {table} (key, kind, at, body) \
                         VALUES ('k', '{kind}', now(), 'x'))"
                    ));
                }
            }
            other => panic!("unknown part {other}"),
        }
    }
    let with = |ctes: &[String]| {
        if ctes.is_empty() {
            String::new()
        } else {
            format!("WITH {} ", ctes.join(", "))
        }
    };
    (
        format!("{}SELECT pg_try_advisory_lock(4242), {fence}", with(&ctes)),
        format!("{}SELECT pg_advisory_unlock_all()", with(&ends)),
    )
}

const SETUP: &str = "CREATE TABLE IF NOT EXISTS floor_fences (id bigint PRIMARY KEY, fence bigint NOT NULL); \
    CREATE TABLE IF NOT EXISTS floor_holders (pid int PRIMARY KEY, id bigint NOT NULL, holder text NOT NULL); \
    CREATE TABLE IF NOT EXISTS floor_runs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
      key text NOT NULL, kind text NOT NULL, at timestamptz NOT NULL, body text NOT NULL); \
    CREATE INDEX IF NOT EXISTS floor_runs_key ON floor_runs (key, id); \
    CREATE SEQUENCE IF NOT EXISTS floor_seq; \
    CREATE TABLE IF NOT EXISTS floor_heap (key text NOT NULL, kind text NOT NULL, at timestamptz NOT NULL, body text NOT NULL)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 7 {
        eprintln!(
            "usage: pg-floor HOST PORT USER DB setup|lock[+fence|+seq][+holder][+runs|+heap] CMD [ARG...]"
        );
        return ExitCode::from(2);
    }
    // FLOOR_MT=1: a runtime with one worker thread, as dlock's (the connection's task on the
    // worker, the statements sent from the main thread).
    let mut builder = if std::env::var_os("FLOOR_MT").is_some() {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(1).max_blocking_threads(1);
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let rt = builder.enable_all().build().expect("runtime");
    rt.block_on(run(&args))
}

async fn run(args: &[String]) -> ExitCode {
    let (host, port, user, db, mode) = (&args[1], &args[2], &args[3], &args[4], &args[5]);
    let mut socket = TcpStream::connect(format!("{host}:{port}"))
        .await
        .expect("connect");
    socket.set_nodelay(true).expect("nodelay");
    // SSLRequest: length 8, code 80877103.
    socket
        .write_all(&[0, 0, 0, 8, 4, 210, 22, 47])
        .await
        .expect("write");
    let mut answer = [0u8; 1];
    socket.read_exact(&mut answer).await.expect("read");
    assert_eq!(answer[0], b'N', "this floor speaks to a server without TLS");
    let mut config = tokio_postgres::Config::new();
    config.user(user).dbname(db);
    let (client, connection) = config
        .connect_raw(socket, tokio_postgres::NoTls)
        .await
        .expect("start-up");
    let (lock, unlock) = if mode == "setup" {
        (SETUP.to_owned(), String::new())
    } else {
        statements(mode)
    };
    let work = async {
        let rows = client.simple_query(&lock).await.expect("lock");
        if mode != "setup" {
            let got = rows.iter().find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            });
            assert_eq!(got.as_deref(), Some("t"), "the lock was not granted");
        }
        let status = Command::new(&args[6])
            .args(&args[7..])
            .status()
            .expect("spawn");
        client.simple_query(&unlock).await.expect("unlock");
        drop(client);
        status
    };
    let conn = tokio::spawn(connection);
    let status = work.await;
    let _ = conn.await;
    ExitCode::from(u8::try_from(status.code().unwrap_or(1)).unwrap_or(1))
}
