//! haproxy in TCP mode, started for the duration of a benchmark.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

pub struct Haproxy {
    pub addr: String,
    child: Child,
    _dir: TempDir,
}

impl Haproxy {
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub async fn start(upstream: &str) -> crate::tools::Result<Haproxy> {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let dir = TempDir::new()?;
        let cfg = dir.0.join("haproxy.cfg");
        std::fs::write(
            &cfg,
            format!(
                "global\n  maxconn 4096\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 120s\n  timeout server 120s\n\
                 frontend bench\n  bind 127.0.0.1:{port}\n  default_backend upstream\n\
                 backend upstream\n  server s1 {upstream}\n"
            ),
        )?;
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                crate::tools::fail!("haproxy is not installed ({e}); apt-get install haproxy")
            })?;
        let addr = format!("127.0.0.1:{port}");
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(&addr).await.is_ok() {
                return Ok(Haproxy {
                    addr,
                    child,
                    _dir: dir,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        crate::tools::bail!("haproxy did not start listening on {addr}")
    }
}

struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        let p = std::env::temp_dir().join(format!("laconic-bench-{}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
