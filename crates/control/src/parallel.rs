//! The one fan-out of the tool: a step sent to every process of a group at once, one thread
//! each, results in the items' order.

/// Runs `f` on every item at once, one thread each, and returns the results in order.
pub(crate) fn for_each<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = items.iter().map(|item| scope.spawn(|| f(item))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// [`for_each`] over items each thread may change (a participant's connection).
pub(crate) fn for_each_mut<T: Send, R: Send>(
    items: Vec<&mut T>,
    f: impl Fn(&mut T) -> R + Sync,
) -> Vec<R> {
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || f(item)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}
