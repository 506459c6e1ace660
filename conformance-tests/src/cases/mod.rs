//! The table of cases: the specification a driver is held to, one line per promise, grouped
//! by area. Each case is a plain `pub async fn(&dyn Harness) -> Result<(), Failure>` in its
//! area's module, which third-party suites may also call directly; what a case needs from a
//! driver is in `requires`, the toolbox the cases share in `support`.

use std::future::Future;
use std::pin::Pin;

use lock_core::Capabilities;

use crate::{Failure, Harness};
use requires::*;

pub mod election;
pub mod exclusion;
pub mod expiry;
pub mod faults;
pub mod fencing;
pub mod input;
pub mod inspect;
pub mod lost;
pub mod ownership;
pub mod permits;
pub mod renewal;
pub mod repeated;
pub mod runtime;
pub mod safety;
pub mod security;
pub mod server;
pub mod shared;
pub mod slow;
pub mod telemetry;
pub mod waiting;

mod requires;
mod support;

pub use support::record_states;

/// What the runner knows about a driver before it picks cases.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Facts {
    /// The driver's declared capabilities.
    pub caps: Capabilities,
    /// [`Harness::backend_requests`] answers.
    pub counts_requests: bool,
    /// [`Harness::break_lock`] works.
    pub can_break: bool,
    /// [`Harness::key_exists`] answers.
    pub sees_keys: bool,
    /// [`Harness::faulty_client`] is supported.
    pub can_fault: bool,
    /// [`Harness::secured`] names a server that requires a password: `Some(true)` if it
    /// refuses a wrong one, `Some(false)` if a wrong one is just another identity.
    pub auth: Option<bool>,
    /// [`Harness::secured`] names a TLS-only server.
    pub tls: bool,
    /// ... and a way to give it the CA as PEM bytes.
    pub tls_pem: bool,
    /// [`Harness::secured`] answers: clients can be made from URLs.
    pub by_url: bool,
    /// [`Harness::restart_backend`] is supported.
    pub can_restart: bool,
    /// [`Harness::step_clock`] is supported.
    pub can_step_clock: bool,
    /// How long a lease asked for with a TTL of [`server::RESTART_WINDOW`] × 3 is vouched for
    /// at its grant (`valid_until` less the time of the request): that TTL, less drift, or a
    /// session timeout where leases last a session. `None`: no such lease could be had.
    pub lease_window: Option<std::time::Duration>,
    /// The driver's backend name.
    pub backend: &'static str,
}

/// The future a case returns.
pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = Result<(), Failure>> + Send + 'a>>;

/// One conformance case.
#[derive(Clone, Copy)]
pub struct Case {
    /// `area::case`, the name the runner lists and filters on.
    pub name: &'static str,
    /// `Err(reason)` when the driver cannot be held to this case.
    pub requires: fn(&Facts) -> Result<(), &'static str>,
    /// The case itself.
    pub run: for<'a> fn(&'a dyn Harness) -> CaseFuture<'a>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

macro_rules! case {
    ($area:ident :: $name:ident, $req:expr) => {
        Case {
            name: concat!(stringify!($area), "::", stringify!($name)),
            requires: $req,
            run: |h| Box::pin($area::$name(h)),
        }
    };
}

/// The name of case `area::name` as the table lists it, checked by the compiler: a case
/// renamed or removed no longer compiles where it is named (the negative controls).
macro_rules! case_name {
    ($area:ident :: $name:ident) => {{
        let _ = $crate::cases::$area::$name;
        concat!(stringify!($area), "::", stringify!($name))
    }};
}
pub(crate) use case_name;

/// Every case, in the order the runner lists them.
pub static CASES: &[Case] = &[
    case!(exclusion::single_winner_among_racers, always),
    case!(exclusion::held_lock_refuses_others, always),
    case!(exclusion::counter_loses_no_update, always),
    case!(exclusion::names_are_independent, always),
    case!(exclusion::release_frees_only_its_own_name, always),
    case!(exclusion::release_frees_at_once, always),
    case!(exclusion::cancelled_release_still_frees, always),
    case!(
        telemetry::acquisitions_renewals_and_releases_are_reported,
        always
    ),
    case!(telemetry::a_handoff_is_reported, always),
    case!(telemetry::a_loss_is_reported_with_its_reason, breakable),
    case!(
        telemetry::a_partitioned_lease_is_reported_at_risk_then_lost,
        partitions
    ),
    case!(
        telemetry::a_cut_session_is_reported_lost_as_connection_closed,
        delays_and_connection_bound
    ),
    case!(inspect::inspect_reports_the_holder, inspects),
    case!(inspect::backend_key_is_the_locks_own, always),
    case!(inspect::backend_key_exists_on_the_server, sees_keys),
    case!(
        inspect::inspect_follows_expiry_and_takeover,
        inspects_and_ttl
    ),
    case!(expiry::abandoned_lease_frees_after_ttl, ttl),
    case!(expiry::valid_until_is_within_ttl, always),
    case!(
        expiry::regrants_after_a_release_claim_no_more_than_their_ttl,
        always
    ),
    case!(expiry::unrenewed_lease_turns_lost_at_valid_until, ttl),
    case!(expiry::expired_lock_goes_to_exactly_one_racer, ttl),
    case!(expiry::odd_ttl_holds_until_valid_until, ttl),
    case!(expiry::valid_until_counts_from_before_the_request, delays),
    case!(
        expiry::a_grant_that_arrives_expired_is_not_handed_out,
        delays_and_ttl
    ),
    case!(ownership::stale_release_keeps_successor, ttl),
    case!(ownership::stale_renew_keeps_successor, ttl),
    case!(ownership::dropped_stale_lease_keeps_successor, ttl),
    case!(ownership::ownership_is_per_lease_not_per_client, ttl),
    case!(ownership::broken_lock_release_is_not_held, breakable),
    case!(ownership::stale_renew_does_not_extend_new_lease, ttl),
    case!(ownership::release_after_expiry_is_not_held, ttl),
    case!(
        ownership::broken_lease_renew_does_not_extend_the_clients_new_lease,
        breakable
    ),
    case!(renewal::manual_renew_extends, ttl),
    case!(renewal::cancelled_renew_leaves_the_lease_held, always),
    case!(renewal::renew_after_expiry_fails_and_does_not_recreate, ttl),
    case!(
        renewal::renew_at_valid_until_fails_though_the_server_still_has_the_lock,
        ttl
    ),
    case!(renewal::auto_renew_keeps_lock, ttl),
    case!(renewal::lease_outlives_its_client_handle, always),
    case!(renewal::watchdog_renews_at_about_a_third_of_the_ttl, always),
    case!(renewal::watchdog_stops_after_release, ttl),
    case!(renewal::watchdog_stops_on_drop, ttl),
    case!(renewal::max_hold_ends_lease, ttl),
    case!(fencing::tokens_present_iff_declared, always),
    case!(fencing::tokens_increase_across_holders, fencing),
    case!(fencing::tokens_increase_on_a_same_client_regrant, fencing),
    case!(fencing::token_is_the_grants_for_its_life, fencing),
    case!(fencing::tokens_follow_grant_order_under_contention, fencing),
    case!(fencing::token_increases_after_expiry, ttl_and_fencing),
    case!(fencing::token_survives_idle_name, fencing),
    case!(
        fencing::strict_tokens_survive_backend_restart,
        strict_and_restart
    ),
    case!(
        server::a_held_lock_survives_a_backend_restart,
        survives_restart
    ),
    case!(
        server::a_step_of_the_servers_clock_does_not_move_expiry,
        elapsed_expiry_and_clock
    ),
    case!(
        server::tokens_do_not_follow_the_servers_clock,
        fencing_and_clock
    ),
    case!(waiting::waiter_wakes_promptly_after_release, always),
    case!(waiting::bounded_waiter_wakes_promptly_after_release, always),
    case!(waiting::try_acquire_does_not_wait, always),
    case!(waiting::waiting_is_idle, counts),
    case!(waiting::wait_timeout_is_respected, always),
    case!(waiting::no_wait_fails_fast, always),
    case!(waiting::spent_deadline_still_tries_once, always),
    case!(waiting::timed_out_waiter_leaves_no_record, always),
    case!(waiting::timed_out_waiter_does_not_block_waiters, always),
    case!(waiting::cancelled_waiter_does_not_block_others, always),
    case!(waiting::cancelled_acquire_leaves_no_holder, always),
    case!(waiting::cancelled_in_flight_leaves_no_holder, delays),
    case!(waiting::cancelled_waiter_in_flight_leaves_nothing, delays),
    case!(waiting::waiters_served_fifo, fifo),
    case!(waiting::waiters_served_fifo_after_expiry, fifo_and_ttl),
    case!(waiting::try_acquire_never_jumps_the_queue, fifo),
    case!(waiting::every_waiter_gets_one_turn, always),
    case!(lost::lost_fires_before_successor_is_granted, lost_ttl),
    case!(
        lost::lost_fires_before_max_hold_successor,
        lost_notification
    ),
    case!(lost::lost_fires_when_renewal_refused, breakable),
    case!(lost::lost_signal_resolves_on_release, always),
    case!(lost::lost_signal_resolves_on_abandon, always),
    case!(lost::dropped_lease_frees_promptly, always),
    case!(input::rejects_bad_names, always),
    case!(input::every_valid_name_is_its_own_key, always),
    case!(input::rejects_bad_options_without_side_effects, always),
    case!(input::undeclared_modes_are_unsupported, always),
    case!(input::effective_ttl_never_shorter, always),
    case!(
        input::max_length_names_differing_at_the_end_are_independent,
        always
    ),
    case!(
        input::names_differing_in_punctuation_are_independent,
        always
    ),
    case!(input::declared_max_ttl_is_enforced, always),
    case!(input::declared_min_ttl_is_granted, always),
    case!(runtime::no_call_blocks_the_runtime, always),
    case!(runtime::no_call_blocks_the_runtime_under_faults, delays),
    case!(
        faults::partitioned_holder_knows_before_anyone_is_granted,
        partitions
    ),
    case!(
        faults::dropped_connection_is_survived_by_an_auto_renewed_lease,
        delays_and_outlives
    ),
    case!(
        faults::dropped_connection_is_lost_at_once,
        delays_and_connection_bound
    ),
    case!(
        faults::lost_fires_after_a_reconnect,
        reconnects_and_breakable
    ),
    case!(faults::unreachable_backend_is_an_error, delays),
    case!(faults::lost_reply_leaves_no_orphan, delays),
    case!(faults::failed_release_still_frees, delays),
    case!(
        faults::dropped_lease_still_frees_after_a_lost_release,
        delays
    ),
    case!(faults::cut_off_holder_gets_answers_not_hangs, delays),
    case!(slow::a_slow_link_is_never_busy, delays),
    case!(repeated::every_grant_keeps_its_promises, always),
    case!(safety::history_is_clean, always),
    case!(election::one_leader_at_a_time, elects),
    case!(election::leader_reports_value_and_term, elects),
    case!(
        election::proclaim_after_the_end_changes_nothing,
        elects_and_ends
    ),
    case!(
        election::deposed_leader_knows_before_a_successor,
        elects_and_lost_ttl
    ),
    case!(election::cancelled_campaign_leaves_no_candidate, elects),
    case!(election::observer_sees_each_leader_in_order, elects),
    case!(election::observing_is_idle, elects_and_counts),
    case!(shared::shared_holders_overlap, shared),
    case!(shared::exclusive_excludes_shared, shared),
    case!(shared::shared_excludes_exclusive, shared),
    case!(shared::waiting_writer_is_not_starved, shared_and_fifo),
    case!(
        shared::abandoned_shared_lease_frees_after_ttl,
        shared_and_ttl
    ),
    case!(
        shared::stale_shared_release_keeps_the_others,
        shared_and_ttl
    ),
    case!(shared::cancelled_shared_waiter_leaves_nothing, shared),
    case!(shared::tokens_increase_across_modes, shared_and_fencing),
    case!(shared::shared_waiting_is_idle, shared_and_counts),
    case!(permits::at_most_k_holders, permits),
    case!(permits::released_permit_goes_to_a_waiter, permits),
    case!(permits::abandoned_permit_comes_back, permits_and_ttl),
    case!(
        permits::stale_release_keeps_the_successors_permit,
        permits_and_ttl
    ),
    case!(permits::permit_count_mismatch_is_refused, permits),
    case!(
        permits::permit_count_mismatch_with_a_waiter,
        permits_and_fifo
    ),
    case!(permits::tokens_increase_across_permits, permits_and_fencing),
    case!(permits::cancelled_permit_waiter_leaves_nothing, permits),
    case!(permits::permits_and_other_modes_exclude, permits),
    case!(permits::permit_waiting_is_idle, permits_and_counts),
    case!(security::right_credentials_lock_and_never_show, auth),
    case!(
        security::wrong_password_is_unauthenticated,
        checks_passwords
    ),
    case!(security::missing_credentials_are_unauthenticated, auth),
    case!(security::password_never_shows_in_errors, by_url),
    case!(security::silent_server_is_a_retryable_error, by_url),
    case!(security::tls_with_the_ca_from_the_url_locks, tls),
    case!(security::tls_with_the_ca_as_pem_locks, tls_pem),
    case!(security::tls_refuses_an_untrusted_certificate, tls),
    case!(security::tls_refuses_a_certificate_for_another_name, tls),
    case!(security::tls_trusts_only_the_ca_it_is_given, tls),
    case!(security::bad_ca_file_is_a_config_error, tls),
];
