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

    /// Kills it (SIGKILL); its data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        if std::env::var_os("PG_IDGEN_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
