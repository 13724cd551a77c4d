//! Listeners: HTTPS (rustls, reloading certificate) for the API server and scheduler, and a
//! plain-HTTP admin listener for probes and metrics. Both drain gracefully on shutdown.

pub mod admin;
mod conn;
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

use crate::metrics::{label, Metrics};

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
    pub metrics: Arc<Metrics>,
}

impl ConnectionLimits {
    pub fn from_config(cfg: &crate::config::Config, metrics: Arc<Metrics>) -> Self {
        let l = &cfg.limits;
        Self {
            max_connections: l.max_connections,
            handshake_timeout: Duration::from_secs_f64(l.handshake_timeout_seconds),
            header_read_timeout: Duration::from_secs_f64(l.header_read_timeout_seconds),
            idle_timeout: Duration::from_secs_f64(l.idle_timeout_seconds),
            grace: Duration::from_secs(cfg.shutdown_grace_seconds),
            metrics,
        }
    }

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
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            limits.metrics.connections_refused.inc();
            if last_refusal_log.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
                tracing::warn!(%peer, max = limits.max_connections, "connection cap reached; closing new connections");
                last_refusal_log = Some(tokio::time::Instant::now());
            }
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let conn = Connection { tls: tls.clone(), router: router.clone(), watcher: graceful.watcher(), limits: limits.clone() };
        let open = limits.metrics.connections_open.clone();
        tokio::spawn(async move {
            open.inc();
            conn.run(tcp, peer).await;
            open.dec();
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("connections drained"),
        _ = tokio::time::sleep(limits.grace) => tracing::warn!(grace = ?limits.grace, "connections still open after the grace period"),
    }
}

struct Connection {
    tls: Option<TlsAcceptor>,
    router: Router,
    watcher: hyper_util::server::graceful::Watcher,
    limits: ConnectionLimits,
}

impl Connection {
    async fn run(self, tcp: tokio::net::TcpStream, peer: SocketAddr) {
        let activity = conn::Activity::new();
        match self.tls.clone() {
            Some(acceptor) => match tokio::time::timeout(self.limits.handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => self.http(conn::Tracked::new(stream, activity.clone()), activity, peer).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => {
                    self.limits.timed_out("handshake");
                    tracing::debug!(%peer, "TLS handshake timed out");
                }
            },
            None => self.http(conn::Tracked::new(tcp, activity.clone()), activity, peer).await,
        }
    }

    async fn http<IO>(self, io: conn::Tracked<IO>, activity: Arc<conn::Activity>, peer: SocketAddr)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Connection { router, watcher, limits, .. } = self;
        let requests = activity.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let guard = requests.request();
            let call = router.clone().oneshot(req.map(axum::body::Body::new));
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
        }
    }
}

/// Bind, with the address in the error.
pub async fn bind(addr: &str) -> Result<(TcpListener, SocketAddr), std::io::Error> {
    let l = TcpListener::bind(addr).await.map_err(|e| std::io::Error::new(e.kind(), format!("binding {addr}: {e}")))?;
    let local = l.local_addr()?;
    Ok((l, local))
}
