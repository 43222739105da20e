//! One etcd (Debian's `etcd-server`, installed by scripts/setup) on
//! loopback ports of its own, run as `postgres`: the DCS of the Patroni
//! tests and the lease store of the lease tests. Stopped (and its files
//! removed) when the handle is dropped, even when a test fails; it can be
//! stopped and started again on the same ports with its data kept.

use std::path::{Path, PathBuf};
use std::process::Child;

use crate::eventually;
use crate::patroni::{free_port, owned_dir, spawn_as_postgres};

pub struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    pub port: u16,
    peer: u16,
}

impl Etcd {
    pub fn start(dir: &Path) -> Etcd {
        let dir = dir.join("etcd");
        owned_dir(&dir);
        let mut etcd = Etcd { child: None, dir, port: free_port(), peer: free_port() };
        etcd.start_again();
        etcd
    }

    /// Why etcd cannot run here, if it cannot.
    pub fn missing() -> Option<String> {
        (!Path::new("/usr/bin/etcd").exists())
            .then(|| "/usr/bin/etcd is missing: scripts/setup installs Debian's etcd-server".to_string())
    }

    /// Its client address, as `pg_idgen.lease_store` takes it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts it (again), on the same ports and data; waits until it answers.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "etcd is running");
        let client = self.url();
        let peer_url = format!("http://127.0.0.1:{}", self.peer);
        self.child = Some(spawn_as_postgres(
            "/usr/bin/etcd",
            &[
                "--name",
                "e1",
                "--data-dir",
                &self.dir.join("data").to_string_lossy(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("e1={peer_url}"),
            ],
            &self.dir.join("etcd.log"),
            &[],
        ));
        let port = self.port;
        eventually(30, "etcd answers", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    }

    /// Stops it answering (SIGSTOP), as a stalled store would; `resume` undoes it.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let child = self.child.as_ref().expect("etcd runs");
        let _ = std::process::Command::new("kill").arg(sig).arg(child.id().to_string()).status();
    }

    /// Writes `value` at `key`, as another tool would (the v3 JSON gateway).
    pub fn put(&self, key: &str, value: &str) {
        self.post("/v3/kv/put", &format!("{{\"key\":\"{}\",\"value\":\"{}\"}}", b64(key), b64(value)));
    }

    /// A new election of `key`: the key deleted and created again naming
    /// `value` (as Patroni's leader key is when another member takes it).
    pub fn elect(&self, key: &str, value: &str) {
        self.post("/v3/kv/deleterange", &format!("{{\"key\":\"{}\"}}", b64(key)));
        self.put(key, value);
    }

    /// The lease `key` is attached to (None: no such key, or none).
    pub fn lease_of(&self, key: &str) -> Option<i64> {
        let answer = self.post("/v3/kv/range", &format!("{{\"key\":\"{}\"}}", b64(key)));
        field(&answer, "lease").filter(|l| *l != 0)
    }

    /// The seconds lease `id` has left as the store counts them (-1 once it ran out or was revoked).
    pub fn ttl_left(&self, id: i64) -> i64 {
        let answer = self.post("/v3/lease/timetolive", &format!("{{\"ID\":\"{id}\"}}"));
        assert!(answer.contains("\"ID\":\""), "{answer}");
        // The gateway leaves out a TTL of 0 (its JSON omits default values).
        field(&answer, "TTL").unwrap_or(0)
    }

    /// One request to the JSON gateway; its answer's body.
    fn post(&self, path: &str, body: &str) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(s, "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        answer
    }

    fn resume_if_running(&self) {
        if self.child.is_some() {
            self.resume();
        }
    }

    /// Kills it (SIGKILL); its data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A number the gateway writes as `"name":"123"` (the first one in the answer).
fn field(answer: &str, name: &str) -> Option<i64> {
    let rest = &answer[answer.find(&format!("\"{name}\":\""))? + name.len() + 4..];
    rest[..rest.find('"')?].parse().ok()
}

/// Base64 (standard alphabet, padded), for the JSON gateway.
fn b64(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.resume_if_running();
        self.stop();
        if std::env::var_os("PG_IDGEN_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
