//! Which clients of a safety run share a connection ([`Workload::sharers`](super::Workload)).

/// The client whose connection client `i` shares (`None`: a connection of its own): the
/// clients without a link, numbered among themselves, go in groups of `sharers`.
pub(super) fn sharing(i: usize, linked: bool, sharers: usize) -> Option<usize> {
    // Clients with a link are the even ones when the harness gives links (see `run`).
    if linked || sharers <= 1 || i % 2 == 0 {
        return None;
    }
    let nth = i / 2; // among the odd clients
    let first = 2 * (nth - nth % sharers) + 1;
    (first != i).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::sharing;

    #[test]
    fn the_clients_without_a_link_go_in_groups_on_the_first_ones_connection() {
        let of = |sharers| {
            (0..16)
                .map(|i| sharing(i, i % 2 == 0, sharers))
                .collect::<Vec<_>>()
        };
        assert!(
            of(1).iter().all(Option::is_none),
            "sharers = 1 shares nothing"
        );
        let four = of(4);
        for (i, s) in four.iter().enumerate() {
            let want = match i {
                3 | 5 | 7 => Some(1),
                11 | 13 | 15 => Some(9),
                _ => None,
            };
            assert_eq!(*s, want, "client {i}");
        }
        // A client with a link never shares, whatever its number.
        assert_eq!(sharing(3, true, 4), None);
    }
}
