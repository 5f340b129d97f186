//! Headless Chromium driven over the DevTools protocol (a small WebSocket client, so
//! the tests need no extra crate).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Finds Chromium, installing Debian's `chromium` package when it is missing. Err
/// says why it cannot be had (the caller skips loudly).
pub fn find_or_install_chromium() -> Result<String, String> {
    let found = || {
        ["chromium", "chromium-browser", "google-chrome"]
            .into_iter()
            .find(|b| {
                Command::new(b)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false)
            })
            .map(str::to_string)
    };
    if let Some(b) = found() {
        return Ok(b);
    }
    eprintln!("chromium is missing: trying `apt-get install -y chromium`");
    let out = Command::new("apt-get")
        .args(["install", "-y", "chromium"])
        .output()
        .map_err(|e| format!("cannot run apt-get: {e}"))?;
    found().ok_or_else(|| {
        format!(
            "apt-get install -y chromium did not give a chromium: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A headless Chromium process and one page, attached in flat mode.
pub struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    ws: Ws,
    session: String,
    next_id: u64,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    pub async fn launch(binary: &str) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn chromium");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.split("DevTools listening on ").nth(1) {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium printed its DevTools URL");
        let mut ws = Ws::connect(&url).await;
        let mut next_id = 1;
        let target = call(
            &mut ws,
            &mut next_id,
            None,
            "Target.createTarget",
            serde_json::json!({"url": "about:blank"}),
        )
        .await;
        let target_id = target["targetId"].as_str().unwrap().to_string();
        let attached = call(
            &mut ws,
            &mut next_id,
            None,
            "Target.attachToTarget",
            serde_json::json!({"targetId": target_id, "flatten": true}),
        )
        .await;
        let session = attached["sessionId"].as_str().unwrap().to_string();
        let mut b = Browser {
            child,
            _profile: profile,
            ws,
            session,
            next_id,
        };
        b.cmd("Page.enable", serde_json::json!({})).await;
        b.cmd(
            "Emulation.setDeviceMetricsOverride",
            serde_json::json!({"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await;
        b
    }

    /// Sends a command to the page; returns its result.
    pub async fn cmd(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let s = self.session.clone();
        call(&mut self.ws, &mut self.next_id, Some(&s), method, params).await
    }

    /// Evaluates `js` in the page; returns its value.
    pub async fn eval(&mut self, js: &str) -> serde_json::Value {
        let r = self
            .cmd(
                "Runtime.evaluate",
                serde_json::json!({"expression": js, "returnByValue": true}),
            )
            .await;
        r["result"]["value"].clone()
    }

    pub async fn navigate(&mut self, url: &str) {
        self.cmd("Page.navigate", serde_json::json!({ "url": url }))
            .await;
    }

    /// Waits until the page at `path_prefix` has loaded and `ready_js` is true.
    pub async fn wait_for(&mut self, what: &str, js: &str) {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let v = self
                .eval(&format!("document.readyState === 'complete' && !!({js})"))
                .await;
            if v == serde_json::Value::Bool(true) {
                return;
            }
            if Instant::now() > end {
                let html = self.eval("document.documentElement.outerHTML").await;
                panic!("browser: {what} did not happen; page is {html}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn location(&mut self) -> String {
        self.eval("location.href")
            .await
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    pub async fn screenshot_png(&mut self) -> Vec<u8> {
        use base64::Engine as _;
        let r = self
            .cmd(
                "Page.captureScreenshot",
                serde_json::json!({"format": "png", "captureBeyondViewport": true}),
            )
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("base64 png")
    }
}

async fn call(
    ws: &mut Ws,
    next_id: &mut u64,
    session: Option<&str>,
    method: &str,
    params: serde_json::Value,
) -> serde_json::Value {
    let id = *next_id;
    *next_id += 1;
    let mut msg = serde_json::json!({"id": id, "method": method, "params": params});
    if let Some(s) = session {
        msg["sessionId"] = s.into();
    }
    ws.send(&msg.to_string()).await;
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < end, "no answer to {method}");
        let text = ws.recv().await;
        let v: serde_json::Value = serde_json::from_str(&text).expect("CDP JSON");
        if v["id"].as_u64() == Some(id) {
            if let Some(e) = v.get("error") {
                panic!("CDP {method} failed: {e}");
            }
            return v["result"].clone();
        }
    }
}

/// The WebSocket client side, text frames only (what CDP uses).
struct Ws {
    stream: TcpStream,
}

impl Ws {
    async fn connect(url: &str) -> Ws {
        let rest = url.strip_prefix("ws://").expect("ws:// URL");
        let (host, path) = rest.split_once('/').unwrap();
        let mut stream = TcpStream::connect(host).await.expect("connect DevTools");
        let req = format!(
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.expect("handshake");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "handshake: {head}");
        Ws { stream }
    }

    async fn send(&mut self, text: &str) {
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8];
        let len = payload.len();
        if len < 126 {
            frame.push(0x80 | len as u8);
        } else if len < 65536 {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(len as u64).to_be_bytes());
        }
        let mask = [0x12u8, 0x34, 0x56, 0x78];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.stream.write_all(&frame).await.unwrap();
    }

    async fn recv(&mut self) -> String {
        let mut message = Vec::new();
        loop {
            let mut h = [0u8; 2];
            self.stream.read_exact(&mut h).await.expect("frame header");
            let fin = h[0] & 0x80 != 0;
            let opcode = h[0] & 0x0f;
            let mut len = (h[1] & 0x7f) as u64;
            if len == 126 {
                let mut b = [0u8; 2];
                self.stream.read_exact(&mut b).await.unwrap();
                len = u16::from_be_bytes(b) as u64;
            } else if len == 127 {
                let mut b = [0u8; 8];
                self.stream.read_exact(&mut b).await.unwrap();
                len = u64::from_be_bytes(b);
            }
            let mut payload = vec![0u8; len as usize];
            self.stream.read_exact(&mut payload).await.unwrap();
            match opcode {
                0x8 => panic!("DevTools closed the connection"),
                0x9 | 0xA => continue,
                _ => message.extend_from_slice(&payload),
            }
            if fin {
                return String::from_utf8(message).expect("UTF-8 text frame");
            }
        }
    }
}
