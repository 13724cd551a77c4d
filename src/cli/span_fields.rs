//! The fields of a span, as the JSON log format keeps them: one JSON object, written straight
//! into the span's string as each field is recorded.
//!
//! tracing-subscriber's own `JsonFields` builds a map of `serde_json::Value`s for every span
//! and then serialises it, which was the largest cost of the webhook's admission span (one per
//! review, issue #45: about 5% of `archer serve`'s CPU under load). The JSON event format reads
//! the string back as an object when an event inside the span is written, so what an event line
//! says is the same: keys sorted, a key recorded twice holding its last value.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

/// `fmt_fields` for the JSON log format.
pub struct SpanFields;

impl<'w> FormatFields<'w> for SpanFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        writer.write_char('{')?;
        let mut v = Fields { out: &mut writer, first: true, result: Ok(()) };
        fields.record(&mut v);
        v.result?;
        writer.write_char('}')
    }

    /// Fields recorded after the span was made go inside its object, after the others.
    fn add_fields(&self, current: &'w mut FormattedFields<Self>, fields: &tracing::span::Record<'_>) -> fmt::Result {
        if current.fields.is_empty() {
            return self.format_fields(current.as_writer(), fields);
        }
        if current.fields.pop() != Some('}') {
            return Err(fmt::Error);
        }
        let first = current.fields.ends_with('{');
        let mut out = String::new();
        let mut v = Fields { out: &mut out, first, result: Ok(()) };
        fields.record(&mut v);
        v.result?;
        current.fields.push_str(&out);
        current.fields.push('}');
        Ok(())
    }
}

/// Writes `"name":value` pairs, comma-separated; the first error is kept.
struct Fields<'a, W: fmt::Write> {
    out: &'a mut W,
    first: bool,
    result: fmt::Result,
}

impl<W: fmt::Write> Fields<'_, W> {
    fn pair(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let sep = if std::mem::take(&mut self.first) { "" } else { "," };
        self.result = self.out.write_str(sep).and_then(|()| string(self.out, field.name())).and_then(|()| self.out.write_char(':')).and_then(|()| value(self.out));
    }
}

/// `s` as a JSON string, escaped by serde_json.
fn string(out: &mut impl fmt::Write, s: &str) -> fmt::Result {
    struct Io<'a, W: fmt::Write>(&'a mut W);
    impl<W: fmt::Write> std::io::Write for Io<'_, W> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            // serde_json writes whole UTF-8 runs of the string and ASCII escapes.
            let s = std::str::from_utf8(buf).map_err(std::io::Error::other)?;
            self.0.write_str(s).map_err(std::io::Error::other)?;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    serde_json::to_writer(Io(out), s).map_err(|_| fmt::Error)
}

impl<W: fmt::Write> Visit for Fields<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.pair(field, |out| string(out, value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.pair(field, |out| out.write_str(if value { "true" } else { "false" }));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.pair(field, |out| write!(out, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.pair(field, |out| write!(out, "{value}"));
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.pair(field, |out| write!(out, "{value}"));
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.pair(field, |out| write!(out, "{value}"));
    }

    /// As serde_json writes an `f64`: a number, or `null` when it is not finite.
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.pair(field, |out| match serde_json::Number::from_f64(value) {
            Some(n) => write!(out, "{n}"),
            None => out.write_str("null"),
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        self.pair(field, |out| string(out, &text));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// What the spans below make an event line say, as parsed JSON: with tracing-subscriber's
    /// `JsonFields` or with [`SpanFields`].
    fn event_lines(ours: bool) -> Vec<serde_json::Value> {
        let lines = Lines::default();
        let builder = tracing_subscriber::fmt().json().flatten_event(true).with_current_span(true).with_span_list(true).with_writer(lines.clone()).with_max_level(tracing::Level::DEBUG);
        let run = || {
            let odd = "quote \" backslash \\ newline \n tab \t nul \u{0} é ☃";
            let span = tracing::info_span!("admission", uid = %"3f2a-uid", namespace = "shop", pod = odd, dry_run = false, replicas = 3u64, delta = -2i64, ratio = 0.5f64, nan = f64::NAN, later = tracing::field::Empty, again = tracing::field::Empty);
            let _e = span.enter();
            tracing::info!(image = "example.com/app:1", "inside");
            span.record("later", "recorded after");
            span.record("later", 7u64);
            let empty = tracing::info_span!("empty", added = tracing::field::Empty);
            let _f = empty.enter();
            tracing::info!("nested, no fields");
            empty.record("added", true);
            span.record("again", tracing::field::debug(&vec!["a", "b"]));
            tracing::warn!("after records");
        };
        if ours {
            tracing::subscriber::with_default(builder.fmt_fields(SpanFields).finish(), run);
        } else {
            tracing::subscriber::with_default(builder.finish(), run);
        }
        let bytes = lines.0.lock().expect("lines").clone();
        String::from_utf8(bytes).expect("utf8").lines().map(|l| serde_json::from_str::<serde_json::Value>(l).expect("each line is JSON")).collect()
    }

    fn without_timestamps(mut lines: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
        for l in &mut lines {
            if let Some(o) = l.as_object_mut() {
                o.remove("timestamp");
            }
        }
        lines
    }

    #[test]
    fn event_lines_say_what_tracing_subscribers_own_json_fields_make_them_say() {
        let ours = without_timestamps(event_lines(true));
        let theirs = without_timestamps(event_lines(false));
        assert_eq!(ours.len(), 3);
        assert_eq!(ours, theirs);
        // The parts that are easy to get wrong: escapes, later records, an emptied object.
        assert_eq!(ours[0]["span"]["pod"], "quote \" backslash \\ newline \n tab \t nul \u{0} é ☃");
        assert_eq!(ours[0]["span"]["nan"], serde_json::Value::Null);
        assert_eq!(ours[2]["spans"][0]["later"], 7);
        assert_eq!(ours[2]["spans"][0]["again"], "[\"a\", \"b\"]");
        assert_eq!(ours[2]["span"]["added"], true);
    }
}
