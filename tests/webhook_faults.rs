//! Faults and bad input: each gets its documented answer, a metric and a log line, never a
//! panic, a 500 or a lost pod.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::time::Duration;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use common::*;
use serde_json::json;

const FAIL_CLOSED: &str = "defaults:\n  onInspectionFailure: fail-closed\n";

fn insecure(hosts: &[&str], extra: &str) -> String {
    let list: Vec<String> = hosts.iter().map(|h| format!("\"{h}\"")).collect();
    format!("registry:\n  insecure: [{}]\n  timeoutSeconds: 1\n{extra}", list.join(", "))
}

fn warning(resp: &serde_json::Value) -> String {
    resp["warnings"].as_array().map(|w| w.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(" | ")).unwrap_or_default()
}

#[tokio::test]
async fn registry_down_fails_open_by_default_and_closed_when_asked() {
    let mut reg = Registry::start().await;
    reg.push_index("app/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let image = reg.image("app/web:1");
    let host = reg.host.clone();
    reg.stop();

    let open = Archer::start(&insecure(&[&host], ""), &[]).await;
    let (resp, p) = open.admit(&pod("down", &[&image])).await;
    assert_eq!(resp["allowed"], true);
    assert!(warning(&resp).contains("registry unavailable"), "{resp}");
    assert_eq!(p["metadata"]["annotations"]["archer.dev/decision"], "inspection-failed");
    assert!(p["metadata"]["annotations"]["archer.dev/inspection-error"].as_str().is_some_and(|e| e.contains(&image)));
    assert_eq!(open.metric("archer_image_inspection_failures_total{reason=\"unavailable\"}").await, 1.0);
    assert!(open.log_text().contains("image inspection failed"));

    let closed = Archer::start(&insecure(&[&host], FAIL_CLOSED), &[]).await;
    let (resp, _) = closed.admit(&pod("down", &[&image])).await;
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["status"]["code"], 403);
    let msg = resp["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(&image) && msg.contains("registry unavailable"), "{msg}");
    assert_eq!(closed.metric("archer_admission_reviews_total{outcome=\"denied\"}").await, 1.0);

    let fallback = Archer::start(&insecure(&[&host], "defaults:\n  fallbackArchitecture: amd64\n"), &[]).await;
    let (resp, p) = fallback.admit(&pod("down", &[&image])).await;
    assert_eq!(resp["allowed"], true);
    assert_eq!(arch_values(&p), vec![vec!["amd64"]]);
    assert_eq!(p["metadata"]["annotations"]["archer.dev/decision"], "fallback");
}

/// As shipped (JSON at info), a denial's line carries the review's span with every field it is
/// made with (uid, namespace, pod), and nothing is logged per review beyond it: the outcome is in
/// the metric. The span records nothing after it is made (each later record cost the JSON format
/// a re-parse of the span's fields per review, issue #45), so what the line shows must come from
/// its creation.
#[tokio::test]
async fn a_denial_logs_its_review_span_and_a_plain_admission_logs_nothing_at_info() {
    let mut reg = Registry::start().await;
    reg.push_index("app/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let image = reg.image("app/web:1");
    let host = reg.host.clone();
    let archer = Archer::start(&insecure(&[&host], FAIL_CLOSED), &["--log-format", "json", "--log", "info"]).await;
    let (resp, _) = archer.admit(&pod("admitted-quietly", &[&image])).await;
    assert_eq!(resp["allowed"], true, "{resp}");
    // A denial made from inspected images is remembered: the replica after it is answered
    // without the span, and its line names the pod itself.
    reg.push_index("app/amd", "1", &["linux/amd64"], true, false).await;
    reg.push_index("app/arm", "1", &["linux/arm64"], true, false).await;
    let (amd, arm) = (reg.image("app/amd:1"), reg.image("app/arm:1"));
    let (first, _) = archer.admit(&pod("split-a", &[&amd, &arm])).await;
    assert_eq!(first["allowed"], false, "{first}");
    // The second is decided too (the first only marks the inputs as seen) and kept.
    let (kept, _) = archer.admit(&pod("split-b", &[&amd, &arm])).await;
    assert_eq!(kept["allowed"], false, "{kept}");
    let replica = review("CREATE", &pod("split-c", &[&amd, &arm]));
    let replica_uid = replica["request"]["uid"].as_str().expect("uid").to_string();
    let (second, _) = archer.admit_review(replica).await;
    assert_eq!(second["allowed"], false, "{second}");
    assert_eq!(second["uid"], replica_uid.as_str(), "the remembered answer carries the replica's uid: {second}");
    reg.stop();
    let denied_review = review("CREATE", &pod("refused", &[&reg.image("app/web:2")]));
    let uid = denied_review["request"]["uid"].as_str().expect("uid").to_string();
    let (resp, _) = archer.admit_review(denied_review).await;
    assert_eq!(resp["allowed"], false, "{resp}");
    let log = archer.log_text();
    let lines: Vec<serde_json::Value> = log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let denied: Vec<&serde_json::Value> = lines.iter().filter(|l| l["message"] == "pod denied" && l["span"]["pod"] == "refused").collect();
    assert_eq!(denied.len(), 1, "one denial line:\n{log}");
    let reused: Vec<&serde_json::Value> = lines.iter().filter(|l| l["message"] == "pod denied (decision reused)").collect();
    assert_eq!(reused.len(), 1, "one line for the replica:\n{log}");
    assert_eq!((reused[0]["uid"].as_str(), reused[0]["namespace"].as_str(), reused[0]["pod"].as_str()), (Some(replica_uid.as_str()), Some("shop"), Some("split-c")), "{log}");
    assert!(reused[0]["denial"].as_str().is_some_and(|d| d.contains("share no platform")), "{log}");
    let span = &denied[0]["span"];
    assert_eq!(span["name"], "admission", "{log}");
    assert_eq!(span["uid"], uid.as_str(), "{log}");
    assert_eq!(span["namespace"], "shop", "{log}");
    assert_eq!(span["pod"], "refused", "{log}");
    assert_eq!(span["operation"], "CREATE", "{log}");
    // The denial's text has a key of its own: a field named `message` wrote a second "message"
    // key beside the line's own, which JSON readers take as one or the other.
    assert!(denied[0]["denial"].as_str().is_some_and(|d| d.contains("app/web:2")), "{log}");
    let denial_lines = log.lines().filter(|l| l.contains("\"pod denied")).count();
    assert_eq!(denial_lines, 4, "{log}");
    assert_eq!(log.lines().filter(|l| l.contains("\"pod denied")).map(|l| l.matches("\"message\":").count()).sum::<usize>(), denial_lines, "{log}");
    assert!(!log.contains("admitted-quietly"), "the admitted pod wrote no line at info:\n{log}");
    assert!(!log.contains("admission review answered"), "the per-review line is at debug:\n{log}");
    assert_eq!(archer.metric("archer_admission_reviews_total{outcome=\"denied\"}").await, 4.0);
    assert_eq!(archer.metric("archer_admission_decisions_reused_total").await, 1.0);
}

#[tokio::test]
async fn slow_registry_times_out_within_the_lookup_bound() {
    let reg = Registry::start().await;
    reg.push_index("app/slow", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let archer = Archer::start(&insecure(&[&reg.host], "  timeoutCacheTtlSeconds: 2\n"), &[]).await;
    reg.pause();
    let (resp, p) = archer.admit(&pod("slow", &[&reg.image("app/slow:1")])).await;
    reg.resume();
    assert_eq!(resp["allowed"], true);
    assert!(warning(&resp).contains("timed out"), "{resp}");
    assert_eq!(p["metadata"]["annotations"]["archer.dev/decision"], "inspection-failed");
    assert_eq!(archer.metric("archer_image_inspection_failures_total{reason=\"timeout\"}").await, 1.0);
    // A timeout is remembered briefly: the next pod naming the image within the TTL is answered
    // at once, without another whole lookup timeout (images that never answer cannot hold the
    // gate controller or admission)...
    let started = std::time::Instant::now();
    let (resp, _) = archer.admit(&pod("slow-soon", &[&reg.image("app/slow:1")])).await;
    assert!(warning(&resp).contains("timed out") && started.elapsed() < Duration::from_millis(800), "{resp} after {:?}", started.elapsed());
    assert_eq!(archer.metric("archer_image_lookups_total{result=\"timeout_hit\"}").await, 1.0);
    // ...and once the TTL has passed and the registry answers again, the pod is placed.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (_, p) = archer.admit(&pod("slow-again", &[&reg.image("app/slow:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64");
}

#[tokio::test]
async fn missing_and_malformed_images() {
    let reg = Registry::start().await;
    reg.push_image_with_config("broken/config", "1", b"this is not an image config", true).await;
    let att = reg.push_image_with_config("broken/index", "att", br#"{"architecture":"unknown","os":"unknown"}"#, true).await;
    let index = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": att.media_type, "digest": att.digest, "size": att.size, "platform": {"os": "unknown", "architecture": "unknown"}}]});
    reg.push_manifest("broken/index", "1", OCI_INDEX, &serde_json::to_vec(&index).expect("json")).await;
    let archer = Archer::start(&insecure(&[&reg.host], FAIL_CLOSED), &[]).await;

    let (resp, _) = archer.admit(&pod("nf", &[&reg.image("nothing/here:1")])).await;
    assert_eq!(resp["allowed"], false);
    assert!(resp["status"]["message"].as_str().is_some_and(|m| m.contains("not found")), "{resp}");

    let (resp, _) = archer.admit(&pod("bad-config", &[&reg.image("broken/config:1")])).await;
    assert!(resp["status"]["message"].as_str().is_some_and(|m| m.contains("malformed") && m.contains("image config")), "{resp}");

    let (resp, _) = archer.admit(&pod("bad-index", &[&reg.image("broken/index:1")])).await;
    assert!(resp["status"]["message"].as_str().is_some_and(|m| m.contains("no runnable platform")), "{resp}");
    assert_eq!(archer.metric("archer_image_inspection_failures_total{reason=\"not_found\"}").await, 1.0);
    assert_eq!(archer.metric("archer_image_inspection_failures_total{reason=\"malformed\"}").await, 2.0);
}

#[tokio::test]
async fn hostile_references_are_refused_without_a_request() {
    let archer = Archer::start("registry:\n  timeoutSeconds: 1\n", &[]).await;
    for (image, reason) in [
        ("169.254.169.254/latest/meta-data:1", "forbidden_address"),
        ("[fd00:ec2::254]/x:1", "forbidden_address"),
        ("[fe80::1]:5000/x:1", "forbidden_address"),
        ("127.0.0.1:5000/x:1", "forbidden_address"),
        ("localhost:5000/x:1", "forbidden_address"),
        ("UPPER/Case", "invalid_reference"),
        ("x@sha256:1234", "invalid_reference"),
    ] {
        let before = archer.metric(&format!("archer_image_inspection_failures_total{{reason=\"{reason}\"}}")).await;
        let (resp, p) = archer.admit(&pod("hostile", &[image])).await;
        assert_eq!(resp["allowed"], true, "{image}");
        assert_eq!(p["metadata"]["annotations"]["archer.dev/decision"], "inspection-failed", "{image}");
        let after = archer.metric(&format!("archer_image_inspection_failures_total{{reason=\"{reason}\"}}")).await;
        assert_eq!(after - before, 1.0, "{image} should fail with {reason}: {resp}");
    }
    assert_eq!(archer.metric("archer_registry_requests_total").await, 0.0, "nothing was sent anywhere");
}

/// A registry endpoint that misbehaves in ways a real registry cannot be made to: redirects to
/// the metadata service, and rate limits. (Mocks are for faults only.)
async fn misbehaving_registry() -> String {
    let manifest = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": format!("sha256:{}", "a".repeat(64)), "size": 1, "platform": {"os": "linux", "architecture": "arm64"}}]});
    let body = serde_json::to_vec(&manifest).expect("json");
    let tries = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = axum::Router::new()
        .route("/v2/redirect/manifests/{r}", axum::routing::get(|| async {
            (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, "http://169.254.169.254/latest/meta-data/")]).into_response()
        }))
        .route("/v2/limited/manifests/{r}", axum::routing::get(|| async {
            (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "120")]).into_response()
        }))
        .route("/v2/briefly-limited/manifests/{r}", axum::routing::get(move || {
            let tries = tries.clone();
            let body = body.clone();
            async move {
                if tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                    return (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "0")]).into_response();
                }
                let mut h = HeaderMap::new();
                h.insert(header::CONTENT_TYPE, OCI_INDEX.parse().expect("hv"));
                (StatusCode::OK, h, body).into_response()
            }
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr.to_string()
}

#[tokio::test]
async fn redirects_to_metadata_and_rate_limits() {
    let host = misbehaving_registry().await;
    let archer = Archer::start(&insecure(&[&host], ""), &[]).await;
    let (_, p) = archer.admit(&pod("redir", &[&format!("{host}/redirect:1")])).await;
    assert!(p["metadata"]["annotations"]["archer.dev/inspection-error"].as_str().is_some_and(|e| e.contains("169.254.169.254")), "{p}");
    assert_eq!(archer.metric("archer_image_inspection_failures_total{reason=\"forbidden_address\"}").await, 1.0);

    let (_, p) = archer.admit(&pod("limited", &[&format!("{host}/limited:1")])).await;
    assert!(p["metadata"]["annotations"]["archer.dev/inspection-error"].as_str().is_some_and(|e| e.contains("rate limit")), "{p}");

    let (_, p) = archer.admit(&pod("brief", &[&format!("{host}/briefly-limited:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/arm64", "a short Retry-After is honoured");
}

#[tokio::test]
async fn malformed_reviews_get_400_with_a_json_error() {
    let archer = Archer::start("", &[]).await;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "bad_json"),
        (b"".to_vec(), "bad_json"),
        (br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"1"}}"#.to_vec(), "wrong_version"),
        (br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(), "no_request"),
        (br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":42}}"#.to_vec(), "bad_shape"),
        (br#"[1,2,3]"#.to_vec(), "wrong_version"),
    ];
    for (body, reason) in cases {
        let (status, json) = archer.post_raw(body.clone()).await;
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
        assert_eq!(json["reason"], reason, "{json}");
        assert!(json["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    assert_eq!(archer.metric("archer_bad_requests_total{reason=\"bad_json\"}").await, 2.0);
    // A review whose pod cannot be decoded is admitted unchanged with a warning.
    let mut r = review("CREATE", &pod("odd", &["nginx"]));
    r["request"]["object"]["spec"]["containers"] = json!("not a list");
    let (resp, _) = archer.admit_review(r).await;
    assert_eq!(resp["allowed"], true);
    assert!(warning(&resp).contains("could not decode"), "{resp}");
}

#[tokio::test]
async fn large_bodies_are_accepted_up_to_the_cap_and_refused_above_it() {
    let archer = Archer::start("registry:\n  timeoutSeconds: 1\n", &[]).await;
    // A 9 MiB review (a pod with a huge annotation) is still answered.
    let mut big = pod("big", &["169.254.169.254/x:1"]);
    big["metadata"]["annotations"] = json!({"blob": "x".repeat(9 * 1024 * 1024)});
    let (resp, _) = archer.admit(&big).await;
    assert_eq!(resp["allowed"], true);
    // Above the 16 MiB default cap: 400 with a JSON error, and the server stays up.
    let (status, json) = archer.post_raw(vec![b' '; 17 * 1024 * 1024]).await;
    assert_eq!(status, 400);
    assert_eq!(json["reason"], "body_too_large");
    let ok = archer.client().get(format!("{}/healthz", archer.https)).send().await.expect("healthz");
    assert!(ok.status().is_success());
}

#[tokio::test]
async fn sigterm_drains_and_exits_cleanly() {
    let archer = Archer::start("shutdownDelaySeconds: 0\n", &[]).await;
    let pid = archer_pid(&archer);
    let ok = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill");
    assert!(ok.success());
    for _ in 0..200 {
        if archer.log_text().contains("stopped") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("archer did not stop on SIGTERM:\n{}", archer.log_text());
}

fn archer_pid(a: &Archer) -> u32 {
    a.pid()
}

#[tokio::test]
async fn oversized_manifests_and_configs_are_refused() {
    let reg = Registry::start().await;
    // A config blob over the 8 MiB cap (the registry itself accepts it).
    let mut big = br#"{"architecture":"arm64","os":"linux","padding":""#.to_vec();
    big.extend(std::iter::repeat_n(b'x', 9 * 1024 * 1024));
    big.extend_from_slice(br#""}"#);
    reg.push_image_with_config("huge/config", "1", &big, true).await;
    let archer = Archer::start(&insecure(&[&reg.host], ""), &[]).await;
    let (_, p) = archer.admit(&pod("huge", &[&reg.image("huge/config:1")])).await;
    assert!(p["metadata"]["annotations"]["archer.dev/inspection-error"].as_str().is_some_and(|e| e.contains("8388608-byte limit")), "{p}");
    assert_eq!(archer.metric("archer_image_inspection_failures_total{reason=\"too_large\"}").await, 1.0);
}
