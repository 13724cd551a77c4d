//! Listeners: HTTPS (rustls, reloading certificate) for the API server and scheduler, and a
//! plain-HTTP admin listener for probes and metrics. Both drain gracefully on shutdown.

pub mod admin;
pub mod body;
pub mod metrics;
mod conn;
pub mod managed_tls;
mod panics;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use archer_metrics::label;
use metrics::ServerMetrics;
pub use panics::{guard, install_hook, ErrorBody};

/// A shutdown signal every server and background task listens to.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

pub struct ShutdownTrigger(watch::Sender<bool>);

pub fn shutdown_channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger(tx), Shutdown(rx))
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.0.send(true);
    }
}

impl Shutdown {
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|v| *v).await;
    }
}

/// What one open connection may hold at most outside the memory budget: TLS record buffers,
/// HTTP/1 read and write buffers, and the HTTP/2 connection window of bytes the client may send
/// before a handler reads them.
pub const CONNECTION_BYTES: usize = 64 * 1024 + H2_CONNECTION_WINDOW as usize;
const H2_CONNECTION_WINDOW: u32 = 256 * 1024;
const H2_STREAM_WINDOW: u32 = 64 * 1024;
const H2_MAX_STREAMS: u32 = 100;

/// The bounds every listener holds its connections to.
#[derive(Clone)]
pub struct ConnectionLimits {
    /// Open connections at most; more are closed at once and counted.
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    /// HTTP/1 request headers must arrive within this long.
    pub header_read_timeout: Duration,
    /// No request in flight and no bytes moving for this long closes the connection.
    pub idle_timeout: Duration,
    /// After shutdown, how long open requests may take to finish.
    pub grace: Duration,
    pub metrics: Arc<ServerMetrics>,
}

impl ConnectionLimits {
    fn timed_out(&self, phase: &'static str) {
        self.metrics.connection_timeouts.get_or_create(&label("phase", phase)).inc();
    }
}

/// Serve `router` over TLS on `listener` until `shutdown`, then let open requests finish for
/// at most `limits.grace`.
pub async fn serve_https(listener: TcpListener, tls: Arc<rustls::ServerConfig>, router: Router, shutdown: Shutdown, limits: ConnectionLimits) {
    serve(listener, Some(TlsAcceptor::from(tls)), router, shutdown, limits).await
}

/// Serve `router` over plain HTTP (the admin and loopback extender listeners).
pub async fn serve_http(listener: TcpListener, router: Router, shutdown: Shutdown, limits: ConnectionLimits) {
    serve(listener, None, router, shutdown, limits).await
}

async fn serve(listener: TcpListener, tls: Option<TlsAcceptor>, router: Router, shutdown: Shutdown, limits: ConnectionLimits) {
    let router = guard(router, limits.metrics.clone());
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let table = Arc::new(conn::Table::default());
    let stop = shutdown.wait();
    tokio::pin!(stop);
    let mut last_refusal_log: Option<tokio::time::Instant> = None;
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => match make_room(&table, &slots, &limits).await {
                Some(slot) => slot,
                None => {
                    limits.metrics.connections_refused.inc();
                    if last_refusal_log.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
                        tracing::warn!(%peer, max = limits.max_connections, "connection cap reached and every connection is answering a request; closing new connections");
                        last_refusal_log = Some(tokio::time::Instant::now());
                    }
                    drop(tcp);
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let activity = conn::Activity::new(tls.is_some());
        let registered = table.register(activity.clone());
        let conn = Connection { tls: tls.clone(), router: router.clone(), watcher: graceful.watcher(), limits: limits.clone() };
        let open = limits.metrics.connections_open.clone();
        tokio::spawn(async move {
            open.inc();
            conn.run(tcp, peer, activity).await;
            open.dec();
            drop(registered);
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("connections drained"),
        _ = tokio::time::sleep(limits.grace) => tracing::warn!(grace = ?limits.grace, "connections still open after the grace period"),
    }
}

/// At the cap, a new connection displaces the one that has made the least progress for the
/// longest (see [`conn::Table::displace_one`]): an attacker holding every slot with stalled
/// connections cannot keep kube-apiserver out. Waits briefly for the displaced one to close; when
/// every stalled one is already displaced and still closing (renewing attackers each displace
/// one), it waits as long for one of those slots rather than refusing at once. Only when every
/// connection is answering a request is the new one refused at once.
async fn make_room(table: &conn::Table, slots: &Arc<Semaphore>, limits: &ConnectionLimits) -> Option<tokio::sync::OwnedSemaphorePermit> {
    match table.displace_one() {
        Some(phase) => {
            limits.metrics.connections_displaced.get_or_create(&label("phase", phase)).inc();
            tracing::debug!(phase, "connection cap reached; displaced the connection with the least progress");
        }
        None if table.closing() => tracing::debug!("connection cap reached; the displaced connections are still closing: waiting for a slot"),
        None => return None,
    }
    tokio::time::timeout(Duration::from_millis(500), slots.clone().acquire_owned()).await.ok()?.ok()
}

struct Connection {
    tls: Option<TlsAcceptor>,
    router: Router,
    watcher: hyper_util::server::graceful::Watcher,
    limits: ConnectionLimits,
}

impl Connection {
    async fn run(self, tcp: tokio::net::TcpStream, peer: SocketAddr, activity: Arc<conn::Activity>) {
        match self.tls.clone() {
            Some(acceptor) => match self.handshake(acceptor, conn::Tracked::new(tcp, activity.clone()), &activity).await {
                Ok(Ok(stream)) => {
                    activity.handshake_done();
                    self.http(stream, activity, peer).await
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => {
                    self.limits.timed_out("handshake");
                    tracing::debug!(%peer, "TLS handshake timed out");
                }
            },
            None => self.http(conn::Tracked::new(tcp, activity.clone()), activity, peer).await,
        }
    }

    /// The TLS handshake, bounded by the handshake timeout and ended early if displaced.
    async fn handshake<IO>(&self, acceptor: TlsAcceptor, io: IO, activity: &conn::Activity) -> Result<std::io::Result<tokio_rustls::server::TlsStream<IO>>, ()>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        tokio::select! {
            r = tokio::time::timeout(self.limits.handshake_timeout, acceptor.accept(io)) => r.map_err(|_| ()),
            _ = activity.displaced() => Ok(Err(std::io::Error::other("displaced at the connection cap"))),
        }
    }

    async fn http<IO>(self, io: IO, activity: Arc<conn::Activity>, peer: SocketAddr)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Connection { router, watcher, limits, .. } = self;
        let requests = activity.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let (parts, body) = req.into_parts();
            let body = conn::WatchedBody::new(body, &requests);
            let guard = requests.request(!body.is_open());
            let call = router.clone().oneshot(hyper::Request::from_parts(parts, axum::body::Body::new(body)));
            async move {
                let response = call.await;
                drop(guard);
                response
            }
        });
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .max_concurrent_streams(H2_MAX_STREAMS);
        let served = watcher.watch(builder.serve_connection_with_upgrades(TokioIo::new(io), service).into_owned());
        tokio::select! {
            r = served => match r {
                Err(e) if e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_timeout) => {
                    limits.timed_out("headers");
                    tracing::debug!(%peer, "request headers did not arrive in time; connection closed");
                }
                Err(e) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
                Ok(()) => {}
            },
            _ = activity.idle(limits.idle_timeout) => {
                limits.timed_out("idle");
                tracing::debug!(%peer, "idle connection closed");
            }
            _ = activity.displaced() => tracing::debug!(%peer, "connection displaced at the connection cap"),
        }
    }
}

/// Bind, with the address in the error.
pub async fn bind(addr: &str) -> Result<(TcpListener, SocketAddr), std::io::Error> {
    let l = TcpListener::bind(addr).await.map_err(|e| std::io::Error::new(e.kind(), format!("binding {addr}: {e}")))?;
    let local = l.local_addr()?;
    Ok((l, local))
}
