//! The one fan-out of the tool: a step sent to every item at once (every process of a group,
//! every data file, every worker), one thread each, results in the items' order. A worker that
//! panics is reported in its place as [`ControlError::Panicked`], naming the step, whatever the
//! step: the others' results stand.

use crate::ControlError;

/// Runs `f` on every item at once, one thread each, and returns the results in order.
pub(crate) fn for_each<T: Sync, R: Send>(
    step: &'static str,
    items: &[T],
    f: impl Fn(&T) -> Result<R, ControlError> + Sync,
) -> Vec<Result<R, ControlError>> {
    fan_out(step, items.iter().collect(), f)
}

/// [`for_each`] over items each thread may change (a participant's connection).
pub(crate) fn for_each_mut<T: Send, R: Send>(
    step: &'static str,
    items: Vec<&mut T>,
    f: impl Fn(&mut T) -> Result<R, ControlError> + Sync,
) -> Vec<Result<R, ControlError>> {
    fan_out(step, items, f)
}

fn fan_out<I: Send, R: Send>(
    step: &'static str,
    items: Vec<I>,
    f: impl Fn(I) -> Result<R, ControlError> + Sync,
) -> Vec<Result<R, ControlError>> {
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || f(item)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ControlError::Panicked { step }))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_gets_a_result_in_order_and_a_panicked_worker_is_named_in_its_place() {
        let results = for_each("square", &[1, 2, 3, 4], |&n| {
            if n == 3 {
                panic!("worker 3 fails");
            }
            Ok(n * n)
        });
        assert_eq!(results.len(), 4);
        assert_eq!(results[0].as_ref().ok(), Some(&1));
        assert_eq!(results[1].as_ref().ok(), Some(&4));
        assert!(matches!(
            results[2],
            Err(ControlError::Panicked { step: "square" })
        ));
        assert_eq!(results[3].as_ref().ok(), Some(&16));
        assert_eq!(
            results[2].as_ref().unwrap_err().to_string(),
            "a square thread panicked"
        );
    }

    #[test]
    fn each_thread_changes_its_own_item() {
        let mut items = vec![1, 2, 3];
        let results = for_each_mut("double", items.iter_mut().collect(), |n| {
            *n *= 2;
            Ok(*n)
        });
        assert_eq!(items, [2, 4, 6]);
        assert!(results.iter().all(Result::is_ok));
    }
}
