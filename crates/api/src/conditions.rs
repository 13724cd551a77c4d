//! Status conditions (`metav1.Condition`) as Kubernetes controllers keep them: one per type, its
//! transition time changing only when its status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Set condition `type_` in `conditions` (added if missing); the transition time is kept while
/// the status stays the same. Whether anything changed.
pub fn set(conditions: &mut Vec<Condition>, type_: &str, status: &str, reason: &str, message: &str, generation: Option<i64>) -> bool {
    let now = || Time(k8s_openapi::jiff::Timestamp::now());
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let changed = c.status != status || c.reason != reason || c.message != message || c.observed_generation != generation;
            if c.status != status {
                c.last_transition_time = now();
            }
            (c.status, c.reason, c.message, c.observed_generation) = (status.into(), reason.into(), message.into(), generation);
            changed
        }
        None => {
            conditions.push(Condition { type_: type_.into(), status: status.into(), reason: reason.into(), message: message.into(), last_transition_time: now(), observed_generation: generation });
            true
        }
    }
}

/// The status (`True`, `False`, `Unknown`) of condition `type_`, if set.
pub fn status<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a str> {
    conditions.iter().find(|c| c.type_ == type_).map(|c| c.status.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let mut c = Vec::new();
        assert!(set(&mut c, "Ready", "False", "Launching", "", Some(1)));
        let first = c[0].last_transition_time.clone();
        assert!(!set(&mut c, "Ready", "False", "Launching", "", Some(1)), "nothing changed");
        assert!(set(&mut c, "Ready", "False", "NodeNotReady", "kubelet", Some(1)), "a new reason is a change");
        assert_eq!(c[0].last_transition_time, first, "same status, same transition time");
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(set(&mut c, "Ready", "True", "Ready", "", Some(1)));
        assert!(c[0].last_transition_time.0 > first.0);
        assert_eq!((c.len(), status(&c, "Ready"), status(&c, "Other")), (1, Some("True"), None));
    }
}
