//! `idemgate injector`: the mutating admission webhook. It serves `POST /mutate` over
//! HTTPS (the API server only calls webhooks over TLS) and answers each
//! AdmissionReview with `review::review`, which injects through the same `inject_pod`
//! as `idemgate inject`. The certificate and key are read from files and read again
//! when they change, as cert-manager rotates them in the mounted Secret.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, SemaphorePermit, watch};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::SidecarOptions;
use super::review::{Reviewed, review};
use crate::conn::{FirstBytes, Lifetime};

/// The largest AdmissionReview accepted: the API server's own limit on a request's
/// body, so no pod it accepted is refused here.
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// Reviews parsed at once, their bodies read whole: with the body budget, what bounds
/// the injector's memory (see the Deployment's limit in
/// k8s/injector/base/deployment.yaml).
const MAX_REVIEWS: usize = 2;
/// The bytes of the bodies being read or reviewed, all requests together: four bodies
/// at the limit (a real pod's is far smaller: etcd keeps objects under 1.5 MiB). A
/// body's bytes are taken as they arrive, so a slow sender holds what it sent, not a
/// slot: a review is held up only by clients that sent this much in all and stopped.
/// Bodies beyond it wait for bytes to be given back (within their 10 s).
const BODY_BUDGET: usize = 4 * MAX_BODY;
/// A connection's HTTP/1 read buffer, so its body's pieces: what a request waiting for
/// `BODY_BUDGET` holds beyond it. Also the largest request head (an API server's is
/// well under 1 KiB).
const MAX_READ_BUFFER: usize = 64 * 1024;
/// A request's whole time: reading its body (a slow sender), waiting for a review
/// slot, the review itself.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// What ends a connection the API server (or anyone) keeps open: a PING unanswered for
/// 10 s, a minute without a request, two minutes of age; the request in hand then gets
/// `REQUEST_TIMEOUT` to finish.
const LIFETIME: Lifetime = Lifetime {
    keep_alive: Duration::from_secs(10),
    idle: Duration::from_secs(60),
    max_age: Duration::from_secs(120),
    drain: REQUEST_TIMEOUT,
};
/// How often the certificate files are compared with what is served.
const RELOAD_EVERY: Duration = Duration::from_secs(1);
/// A client gets this long from connecting to complete its TLS handshake and begin its
/// first request, then this long again for the request's head.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections get this long to finish their requests and close after SIGTERM.
const DRAIN: Duration = Duration::from_secs(10);
/// Connections served at once; more are closed at once. The API server keeps a few
/// per replica; the bound keeps anything else in the cluster from exhausting memory.
const MAX_CONNECTIONS: usize = 128;

/// The command line of `idemgate injector`; the sidecar options are the defaults that
/// a pod's annotations override.
#[derive(Debug, Clone, clap::Args)]
pub struct InjectorArgs {
    /// The serving certificate (PEM, leaf first, then its chain).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,
    /// The address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub sidecar: SidecarOptions,
}

/// The certificate in use, swapped whole when the files change.
#[derive(Debug)]
struct Certificates {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Vec<u8>, Arc<CertifiedKey>)>,
}

impl Certificates {
    fn load(cert: &Path, key: &Path) -> Result<Certificates, String> {
        let (bytes, certified) = read_pair(cert, key)?;
        Ok(Certificates {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new((bytes, certified)),
        })
    }

    /// Reads the files again; serves them if they changed and make a valid pair.
    /// Half-written files (cert-manager writes both) are retried at the next tick.
    fn reload(&self) {
        let (Ok(cert), Ok(key)) = (std::fs::read(&self.cert), std::fs::read(&self.key)) else {
            tracing::warn!(
                "injector: cannot read the certificate files; still serving the previous certificate"
            );
            return;
        };
        let bytes = [cert, key].concat();
        if self.current.read().map(|c| c.0 == bytes).unwrap_or(true) {
            return;
        }
        match read_pair(&self.cert, &self.key) {
            Ok(pair) => {
                if let Ok(mut current) = self.current.write() {
                    *current = pair;
                    tracing::info!("injector: certificate reloaded");
                }
            }
            Err(e) => tracing::warn!("injector: {e}; still serving the previous certificate"),
        }
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.1.clone())
    }
}

/// The files' bytes (to notice a change) and the key pair they make.
fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Arc<CertifiedKey>), String> {
    let cert_pem =
        std::fs::read(cert).map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    let key_pem = std::fs::read(key).map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert {}: no certificate in the file",
            cert.display()
        ));
    }
    let private = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, private, &provider)
        .map_err(|e| format!("--tls-cert and --tls-key do not make a key pair: {e}"))?;
    Ok(([cert_pem, key_pem].concat(), Arc::new(certified)))
}

/// Serves until `shutdown` resolves; an error only when it cannot start.
pub async fn run(args: InjectorArgs, shutdown: impl Future<Output = ()>) -> Result<(), String> {
    let certificates = Arc::new(Certificates::load(&args.tls_cert, &args.tls_key)?);
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS: {e}"))?
    .with_no_client_auth()
    .with_cert_resolver(certificates.clone());
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(%local, "injector: serving POST /mutate over HTTPS");

    let reloader = {
        let certificates = certificates.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_EVERY);
            loop {
                tick.tick().await;
                let c = certificates.clone();
                let _ = tokio::task::spawn_blocking(move || c.reload()).await;
            }
        })
    };
    let reviewer = Arc::new(Reviewer {
        defaults: args.sidecar,
        reviews: Semaphore::new(MAX_REVIEWS),
        bodies: Semaphore::new(BODY_BUDGET),
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .max_buf_size(MAX_READ_BUFFER);
    LIFETIME.configure(&mut builder);
    let connections = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (stop, stopping) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of file descriptors and the like: don't spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!("injector: {MAX_CONNECTIONS} connections open; one closed");
                    continue;
                };
                let acceptor = acceptor.clone();
                let reviewer = reviewer.clone();
                let builder = builder.clone();
                let stopping = stopping.clone();
                connections.spawn(async move {
                    let _slot = slot;
                    serve(Connection { stream, acceptor, reviewer, builder, stopping }).await;
                });
            }
            _ = &mut shutdown => break,
        }
    }
    // The Deployment's preStop has kept it accepting while the endpoints were
    // withdrawn; now every connection finishes the request it is serving and closes.
    drop(listener);
    let _ = stop.send(true);
    connections.close();
    if tokio::time::timeout(DRAIN, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("injector: connections still open after {DRAIN:?}; stopping anyway");
    }
    reloader.abort();
    Ok(())
}

/// What every request needs: the sidecar's defaults and the bounds on reviews at once
/// and on the bytes of their bodies.
struct Reviewer {
    defaults: SidecarOptions,
    reviews: Semaphore,
    bodies: Semaphore,
}

/// One accepted TCP connection and what serving it takes.
struct Connection {
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    reviewer: Arc<Reviewer>,
    builder: hyper_util::server::conn::auto::Builder<TokioExecutor>,
    stopping: watch::Receiver<bool>,
}

/// TLS, then HTTP until the client closes, the connection idles or reaches its age
/// limit, or the injector stops (see `LIFETIME`; the last three close it gracefully).
/// A client that has not begun a request `HANDSHAKE_TIMEOUT` after connecting (its
/// handshake unfinished, or nothing sent after it) is closed: it would hold its slot
/// until the idle limit.
async fn serve(c: Connection) {
    let Connection {
        stream,
        acceptor,
        reviewer,
        builder,
        mut stopping,
    } = c;
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let tls = tokio::select! {
        tls = tokio::time::timeout_at(deadline, acceptor.accept(stream)) => match tls {
            Ok(Ok(tls)) => tls,
            _ => return,
        },
        _ = stopping.wait_for(|s| *s) => return,
    };
    let svc = service_fn(move |req| {
        let reviewer = reviewer.clone();
        async move {
            let answer = tokio::time::timeout(REQUEST_TIMEOUT, handle(req, &reviewer)).await;
            Ok::<_, Infallible>(answer.unwrap_or_else(|_| {
                plain(StatusCode::REQUEST_TIMEOUT, "the request took too long\n")
            }))
        }
    });
    let stop = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    let tls = FirstBytes::new(tls, deadline);
    crate::conn::serve(&builder, TokioIo::new(tls), svc, LIFETIME, stop).await;
}

/// One request: `POST /mutate` is reviewed, `GET /healthz` answers for probes.
async fn handle(req: Request<Incoming>, reviewer: &Reviewer) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/mutate") => {}
        (&Method::GET, "/healthz") => return plain(StatusCode::OK, "ok\n"),
        (_, "/mutate") => {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "POST an AdmissionReview\n");
        }
        _ => return plain(StatusCode::NOT_FOUND, "not found\n"),
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large();
    }
    let (body, held) = match read_body(req.into_body(), &reviewer.bodies).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    // Taken once the body is in, so that slow senders hold no review slot: the permit
    // bounds the memory of the bodies' parsed copies.
    let Ok(_permit) = reviewer.reviews.acquire().await else {
        return stopping();
    };
    let Reviewed { answer, notes } = review(&body, &reviewer.defaults);
    drop((body, held));
    for note in notes {
        tracing::info!(uid = %answer["response"]["uid"], "injector: {note}");
    }
    if let Some(w) = answer.pointer("/response/warnings") {
        // For a pod a controller creates, nobody sees the API server's warning: this
        // line is where "why has this pod no sidecar" is answered.
        tracing::warn!(uid = %answer["response"]["uid"], warnings = %w, "injector: admitted unchanged");
    }
    let mut r = Response::new(Full::new(Bytes::from(
        serde_json::to_vec(&answer).unwrap_or_default(),
    )));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

/// A request's body, read whole; its bytes are taken from `budget` as they arrive and
/// given back when the returned permit drops.
async fn read_body(
    mut body: Incoming,
    budget: &Semaphore,
) -> Result<(Bytes, SemaphorePermit<'_>), Response<Full<Bytes>>> {
    let mut held = budget.acquire_many(0).await.map_err(|_| stopping())?;
    let mut bytes = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            tracing::debug!("injector: reading a request: {e}");
            plain(
                StatusCode::BAD_REQUEST,
                "the request body could not be read\n",
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let n = u32::try_from(data.len()).map_err(|_| too_large())?;
        if bytes.len() + data.len() > MAX_BODY {
            return Err(too_large());
        }
        held.merge(budget.acquire_many(n).await.map_err(|_| stopping())?);
        bytes.extend_from_slice(&data);
    }
    Ok((bytes.freeze(), held))
}

fn stopping() -> Response<Full<Bytes>> {
    plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n")
}

fn too_large() -> Response<Full<Bytes>> {
    plain(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("an AdmissionReview is at most {MAX_BODY} bytes\n"),
    )
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text.to_string())));
    *r.status_mut() = status;
    r
}
