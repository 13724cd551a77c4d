//! One connection's bookkeeping: when bytes last moved, what it is doing (handshake, a request
//! whose headers or body are still arriving, a request being answered, idle), and when it last
//! made progress (finished its handshake or a request). The idle watchdog closes connections
//! that hold a slot without doing anything; at the connection cap, the [`Table`] picks the
//! connection a new one displaces.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Shared between the IO wrapper, the service wrapper, the idle watchdog and the table.
pub(super) struct Activity {
    origin: Instant,
    /// Milliseconds after `origin` at which bytes last moved.
    last_io_ms: AtomicU64,
    /// Milliseconds after `origin` of the last progress: the handshake done, a request answered.
    progress_ms: AtomicU64,
    /// Bytes read in all, and as of the last progress.
    read_bytes: AtomicU64,
    read_at_progress: AtomicU64,
    in_flight: AtomicUsize,
    /// Whether it has answered a request: a client that has been served (kube-apiserver's
    /// keep-alive connection) goes after every stalled connection that never was.
    served: AtomicBool,
    /// Requests in flight whose body has not all arrived.
    bodies_open: AtomicUsize,
    handshaking: AtomicBool,
    displaced: AtomicBool,
    close: Notify,
}

/// What a connection is doing, as the displacement rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Stalled until it makes progress: in its TLS handshake, or part way into a request's
    /// headers or body. The metric label names which.
    Stalled(&'static str),
    /// A keep-alive connection between requests.
    Idle,
    /// A request with its whole body is being answered: never displaced.
    Busy,
}

impl Activity {
    pub(super) fn new(handshaking: bool) -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            last_io_ms: AtomicU64::new(0),
            progress_ms: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            read_at_progress: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            bodies_open: AtomicUsize::new(0),
            handshaking: AtomicBool::new(handshaking),
            displaced: AtomicBool::new(false),
            close: Notify::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last_io_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn progressed(&self) {
        self.progress_ms.store(self.now_ms(), Ordering::Relaxed);
        self.read_at_progress.store(self.read_bytes.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The TLS handshake finished (plain connections start past it).
    pub(super) fn handshake_done(&self) {
        self.handshaking.store(false, Ordering::Relaxed);
        self.progressed();
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_io_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }

    /// How long since the connection last made progress.
    fn stalled_for(&self) -> Duration {
        let last = Duration::from_millis(self.progress_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }

    pub(super) fn state(&self) -> State {
        if self.handshaking.load(Ordering::Relaxed) {
            return State::Stalled("handshake");
        }
        let in_flight = self.in_flight.load(Ordering::SeqCst);
        if in_flight > 0 {
            return if self.bodies_open.load(Ordering::SeqCst) >= in_flight { State::Stalled("body") } else { State::Busy };
        }
        if self.read_bytes.load(Ordering::Relaxed) > self.read_at_progress.load(Ordering::Relaxed) {
            State::Stalled("headers")
        } else {
            State::Idle
        }
    }

    /// Mark a request in flight until the guard is dropped; `body_done` when it has no body to
    /// wait for.
    pub(super) fn request(self: &Arc<Self>, body_done: bool) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if !body_done {
            self.bodies_open.fetch_add(1, Ordering::SeqCst);
        }
        InFlight(self.clone())
    }

    /// Resolves once the connection has had no request in flight and no bytes moving for `idle`.
    pub(super) async fn idle(&self, idle: Duration) {
        let step = (idle / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
        loop {
            tokio::time::sleep(step).await;
            if self.in_flight.load(Ordering::SeqCst) == 0 && self.idle_for() >= idle {
                return;
            }
        }
    }

    /// Resolves once the table chose this connection to make room for a new one.
    pub(super) async fn displaced(&self) {
        let notified = self.close.notified();
        if self.displaced.load(Ordering::SeqCst) {
            return;
        }
        notified.await
    }

    fn displace(&self) {
        self.displaced.store(true, Ordering::SeqCst);
        self.close.notify_waiters();
    }
}

pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.progressed();
        self.0.served.store(true, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request body that tells its connection's [`Activity`] when it has all arrived (or was
/// dropped unread).
pub(super) struct WatchedBody<B> {
    inner: B,
    open: Option<Arc<Activity>>,
}

impl<B: Body> WatchedBody<B> {
    pub(super) fn new(inner: B, activity: &Arc<Activity>) -> Self {
        let open = (!inner.is_end_stream()).then(|| activity.clone());
        Self { inner, open }
    }

    pub(super) fn is_open(&self) -> bool {
        self.open.is_some()
    }
}

impl<B> WatchedBody<B> {
    fn finished(&mut self) {
        if let Some(a) = self.open.take() {
            a.bodies_open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl<B> Drop for WatchedBody<B> {
    fn drop(&mut self) {
        self.finished();
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for WatchedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
            Poll::Pending => false,
        };
        if ended {
            self.finished();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The open connections of one listener, so one can be chosen to make room.
#[derive(Default)]
pub(super) struct Table {
    open: Mutex<HashMap<u64, Arc<Activity>>>,
    next: AtomicU64,
}

/// Removes its connection from the table when dropped.
pub(super) struct Registered {
    table: Arc<Table>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.table.open.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

impl Table {
    pub(super) fn register(self: &Arc<Self>, activity: Arc<Activity>) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open.lock().unwrap_or_else(|p| p.into_inner()).insert(id, activity);
        Registered { table: self.clone(), id }
    }

    /// Whether a connection already displaced is still open (its slot is about to free).
    pub(super) fn closing(&self) -> bool {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).values().any(|a| a.displaced.load(Ordering::SeqCst))
    }

    /// Choose and signal the connection a new one displaces: the stalled connection (in its
    /// handshake, or part way into a request's headers or body) that has gone longest without
    /// progress, one that never answered a request before one that has (a served client sending
    /// its next request on a kept-alive connection is caught part way into its headers for a
    /// moment); failing that, the keep-alive connection idle longest. A connection answering a
    /// request is never chosen. Returns what the chosen one was doing.
    pub(super) fn displace_one(&self) -> Option<&'static str> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let candidates = open.values().filter(|a| !a.displaced.load(Ordering::SeqCst));
        let mut stalled: Option<((bool, Duration), &'static str, &Arc<Activity>)> = None;
        let mut idle: Option<(Duration, &Arc<Activity>)> = None;
        for a in candidates {
            match a.state() {
                State::Stalled(phase) => {
                    let d = (!a.served.load(Ordering::Relaxed), a.stalled_for());
                    if stalled.as_ref().is_none_or(|(best, _, _)| d > *best) {
                        stalled = Some((d, phase, a));
                    }
                }
                State::Idle => {
                    let d = a.idle_for();
                    if idle.as_ref().is_none_or(|(best, _)| d > *best) {
                        idle = Some((d, a));
                    }
                }
                State::Busy => {}
            }
        }
        let (phase, victim) = match (stalled, idle) {
            (Some((_, phase, a)), _) => (phase, a),
            (None, Some((_, a))) => ("idle", a),
            (None, None) => return None,
        };
        victim.displace();
        Some(phase)
    }
}

/// An IO stream that records when bytes last moved, and how many were read.
pub(super) struct Tracked<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> Tracked<T> {
    pub(super) fn new(inner: T, activity: Arc<Activity>) -> Self {
        activity.touch();
        Self { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        if read > 0 {
            self.activity.touch();
            self.activity.read_bytes.fetch_add(read as u64, Ordering::Relaxed);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(states: &[(&str, Arc<Activity>)]) -> (Arc<Table>, Vec<Registered>) {
        let t = Arc::new(Table::default());
        let regs = states.iter().map(|(_, a)| t.register(a.clone())).collect();
        (t, regs)
    }

    #[tokio::test]
    async fn the_longest_stalled_connection_is_displaced_before_any_idle_one_and_never_a_busy_one() {
        let idle = Activity::new(false);
        idle.handshake_done();
        let busy = Activity::new(false);
        busy.handshake_done();
        let _answering = busy.request(true);
        let old_stall = Activity::new(true);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let new_stall = Activity::new(false);
        new_stall.handshake_done();
        new_stall.read_bytes.fetch_add(10, Ordering::Relaxed); // part of a request's headers
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!((old_stall.state(), new_stall.state(), idle.state(), busy.state()), (State::Stalled("handshake"), State::Stalled("headers"), State::Idle, State::Busy));
        let (table, _regs) = table_with(&[("idle", idle.clone()), ("busy", busy.clone()), ("old", old_stall.clone()), ("new", new_stall.clone())]);
        assert!(!table.closing());
        assert_eq!(table.displace_one(), Some("handshake"));
        assert!(table.closing(), "a displaced connection still open: its slot is about to free, so a newcomer waits for it");
        assert!(old_stall.displaced.load(Ordering::SeqCst));
        assert_eq!(table.displace_one(), Some("headers"));
        assert_eq!(table.displace_one(), Some("idle"), "idle keep-alive connections go only when no stalled one is left");
        assert_eq!(table.displace_one(), None, "a connection answering a request is never displaced");
        assert!(!busy.displaced.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_stalled_connection_that_was_never_served_goes_before_one_that_was() {
        // A served keep-alive connection part way into its next request's headers, stalled
        // longer than a fresh attacker's handshake: the attacker goes first.
        let served = Activity::new(false);
        served.handshake_done();
        drop(served.request(true));
        served.read_bytes.fetch_add(10, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let attacker = Activity::new(true);
        assert_eq!((served.state(), attacker.state()), (State::Stalled("headers"), State::Stalled("handshake")));
        assert!(served.stalled_for() > attacker.stalled_for());
        let (table, _regs) = table_with(&[("served", served.clone()), ("attacker", attacker.clone())]);
        assert_eq!(table.displace_one(), Some("handshake"));
        assert!(attacker.displaced.load(Ordering::SeqCst) && !served.displaced.load(Ordering::SeqCst));
        assert_eq!(table.displace_one(), Some("headers"), "with no other left, a served stalled connection goes too");
    }

    #[tokio::test]
    async fn a_request_whose_body_is_still_arriving_is_stalled_until_it_has_all_arrived() {
        let a = Activity::new(false);
        a.handshake_done();
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let mut watched = WatchedBody::new(axum::body::Body::from_stream(rx), &a);
        let guard = a.request(!watched.is_open());
        assert_eq!(a.state(), State::Stalled("body"));
        use futures::SinkExt;
        tx.send(Ok(Bytes::from_static(b"x"))).await.expect("send");
        drop(tx);
        use http_body_util::BodyExt;
        while watched.frame().await.is_some() {}
        assert_eq!(a.state(), State::Busy, "the whole body is here: the request is being answered");
        drop(guard);
        assert_eq!(a.state(), State::Idle);
        // A displaced connection's waiter wakes, even if it starts waiting after the signal.
        a.displace();
        tokio::time::timeout(Duration::from_secs(1), a.displaced()).await.expect("woken");
    }
}
