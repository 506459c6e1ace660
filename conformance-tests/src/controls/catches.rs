//! Which cases each flaw must fail: the table the suite's own tests read.

use super::Flaw;

/// `case_name!` for each case: the names of the cases a flaw is caught by.
macro_rules! cases {
    ($($area:ident :: $name:ident),* $(,)?) => {
        vec![$(crate::cases::case_name!($area::$name)),*]
    };
}

impl Flaw {
    /// The cases written to catch this flaw (at least one must fail).
    pub fn caught_by(self) -> Vec<&'static str> {
        match self {
            Flaw::None => vec![],
            Flaw::NoMutualExclusion => cases![
                election::one_leader_at_a_time,
                exclusion::single_winner_among_racers,
                exclusion::held_lock_refuses_others,
                exclusion::counter_loses_no_update
            ],
            Flaw::NoExpiry => cases![expiry::abandoned_lease_frees_after_ttl],
            Flaw::EarlyExpiry => cases![expiry::abandoned_lease_frees_after_ttl],
            Flaw::ReleaseWithoutOwnerCheck => cases![
                ownership::stale_release_keeps_successor,
                ownership::broken_lock_release_is_not_held
            ],
            Flaw::RenewResurrects => {
                cases![renewal::renew_after_expiry_fails_and_does_not_recreate]
            }
            Flaw::WatchdogResurrects => cases![renewal::watchdog_stops_after_release],
            Flaw::NonMonotonicFencing => cases![
                fencing::tokens_increase_across_holders,
                fencing::tokens_follow_grant_order_under_contention
            ],
            Flaw::LostSignalNeverFires => cases![
                election::deposed_leader_knows_before_a_successor,
                lost::lost_fires_before_successor_is_granted,
                expiry::unrenewed_lease_turns_lost_at_valid_until
            ],
            Flaw::SpinningWaiter => cases![waiting::waiting_is_idle],
            Flaw::IgnoresWaitTimeout => cases![waiting::wait_timeout_is_respected],
            Flaw::CancelLeavesGhost => cases![
                waiting::cancelled_waiter_does_not_block_others,
                election::cancelled_campaign_leaves_no_candidate
            ],
            Flaw::InspectBlind => cases![inspect::inspect_reports_the_holder],
            Flaw::CancelInFlightLeavesGhost => {
                cases![waiting::cancelled_in_flight_leaves_no_holder]
            }
            Flaw::MaxHoldFreesBeforeLost => cases![lost::lost_fires_before_max_hold_successor],
            Flaw::ExpiredTakeoverNotAtomic => {
                cases![expiry::expired_lock_goes_to_exactly_one_racer]
            }
            Flaw::InspectShowsExpiredHolder | Flaw::InspectRemainingIsTheTtl => {
                cases![inspect::inspect_follows_expiry_and_takeover]
            }
            Flaw::TtlRoundedDown => cases![expiry::odd_ttl_holds_until_valid_until],
            Flaw::ValidUntilFromReply => cases![expiry::valid_until_counts_from_before_the_request],
            Flaw::RegrantOverstatesValidity => {
                cases![expiry::regrants_after_a_release_claim_no_more_than_their_ttl]
            }
            Flaw::BoundedWaitPolls => cases![waiting::bounded_waiter_wakes_promptly_after_release],
            Flaw::TryAcquireWaits => cases![waiting::try_acquire_does_not_wait],
            Flaw::SplitVoteGivesUp => cases![exclusion::single_winner_among_racers],
            Flaw::TimedOutWaiterStaysQueued => {
                cases![waiting::timed_out_waiter_does_not_block_waiters]
            }
            Flaw::NoFifoAfterExpiry => cases![waiting::waiters_served_fifo_after_expiry],
            Flaw::StaleRenewExtendsSameClient => {
                cases![ownership::stale_renew_does_not_extend_new_lease]
            }
            Flaw::ReleaseOfExpiredIsOk => cases![ownership::release_after_expiry_is_not_held],
            Flaw::DropKeepsLock => cases![lost::dropped_lease_frees_promptly],
            Flaw::AbandonKeepsLostPending => cases![lost::lost_signal_resolves_on_abandon],
            Flaw::MaxTtlNotEnforced => cases![input::declared_max_ttl_is_enforced],
            Flaw::NameTruncated => cases![
                input::max_length_names_differing_at_the_end_are_independent,
                input::every_valid_name_is_its_own_key
            ],
            Flaw::EscapingNotInjective => {
                cases![input::names_differing_in_punctuation_are_independent]
            }
            Flaw::CounterForgetsIdleNames => cases![fencing::token_survives_idle_name],
            Flaw::CounterLostOnRestart => cases![fencing::strict_tokens_survive_backend_restart],
            Flaw::RenewsBlindWhilePartitioned | Flaw::NeverReconnects => {
                cases![faults::partitioned_holder_knows_before_anyone_is_granted]
            }
            Flaw::CutLosesLease => {
                cases![faults::dropped_connection_is_survived_by_an_auto_renewed_lease]
            }
            Flaw::SessionLostLate => cases![faults::dropped_connection_is_lost_at_once],
            Flaw::SecretInDebug => cases![security::right_credentials_lock_and_never_show],
            Flaw::SecretInErrors => cases![security::password_never_shows_in_errors],
            Flaw::AnyPasswordAccepted => cases![
                security::wrong_password_is_unauthenticated,
                security::missing_credentials_are_unauthenticated
            ],
            Flaw::TrustsAnyCertificate => cases![security::tls_refuses_an_untrusted_certificate],
            Flaw::MissingCaFileIgnored => cases![security::bad_ca_file_is_a_config_error],
            Flaw::PemCaIgnored => cases![security::tls_with_the_ca_as_pem_locks],
            Flaw::ReleaseOnlyStopsRenewal => cases![exclusion::release_frees_at_once],
            Flaw::RenewIsANoOp => cases![renewal::manual_renew_extends],
            Flaw::AutoRenewNeverRuns => cases![renewal::auto_renew_keeps_lock],
            Flaw::MaxHoldIgnored => cases![renewal::max_hold_ends_lease],
            Flaw::TakeoverKeepsToken => cases![fencing::token_increases_after_expiry],
            Flaw::UnboundedWaitPolls => cases![waiting::waiter_wakes_promptly_after_release],
            Flaw::NoWaitWaits => cases![waiting::no_wait_fails_fast],
            Flaw::ReleaseLeavesLostPending => cases![lost::lost_signal_resolves_on_release],
            Flaw::OwnerIsTheClient => cases![ownership::ownership_is_per_lease_not_per_client],
            Flaw::DropReleasesByName => cases![ownership::dropped_stale_lease_keeps_successor],
            Flaw::WaitersLifo => cases![waiting::waiters_served_fifo],
            Flaw::ValidityBeyondTtl => cases![expiry::valid_until_is_within_ttl],
            Flaw::RenewWithoutOwnerCheck => cases![ownership::stale_renew_keeps_successor],
            Flaw::DroppedLeaseKeepsRenewing => cases![renewal::watchdog_stops_on_drop],
            Flaw::WaiterStarves => cases![waiting::every_waiter_gets_one_turn],
            Flaw::TimedOutWaiterGrantedLater => {
                cases![waiting::timed_out_waiter_leaves_no_record]
            }
            Flaw::FencingUndeclared => cases![fencing::tokens_present_iff_declared],
            Flaw::NamesFoldCase => cases![
                exclusion::names_are_independent,
                input::every_valid_name_is_its_own_key
            ],
            Flaw::ValidatesAfterLocking => {
                cases![input::rejects_bad_options_without_side_effects]
            }
            Flaw::GrantedTtlRoundedDown => cases![input::effective_ttl_never_shorter],
            Flaw::UrlCaIgnored => cases![security::tls_with_the_ca_from_the_url_locks],
            Flaw::RefusalNoticedLate => cases![lost::lost_fires_when_renewal_refused],
            Flaw::TtlInflated => cases![input::effective_ttl_never_shorter],
            Flaw::LostTimerNotRenewed => cases![
                renewal::manual_renew_extends,
                renewal::auto_renew_keeps_lock
            ],
            Flaw::RenewOverstatesValidity => cases![
                renewal::manual_renew_extends,
                expiry::regrants_after_a_release_claim_no_more_than_their_ttl
            ],
            Flaw::UnreachableIsRefusal => cases![faults::unreachable_backend_is_an_error],
            Flaw::SlowIsBusy => cases![slow::a_slow_link_is_never_busy],
            Flaw::AbandonReleases => cases![expiry::abandoned_lease_frees_after_ttl],
            Flaw::ReleaseByPrefix => cases![exclusion::release_frees_only_its_own_name],
            Flaw::IgnoresServerName => {
                cases![security::tls_refuses_a_certificate_for_another_name]
            }
            Flaw::GivenCaTrustsAnyCertificate => {
                cases![security::tls_trusts_only_the_ca_it_is_given]
            }
            Flaw::SpentDeadlineGivesUp => cases![waiting::spent_deadline_still_tries_once],
            Flaw::CancelledReleaseKeepsLock => cases![exclusion::cancelled_release_still_frees],
            Flaw::CancelledGrantStays | Flaw::UnreadGrantStays => {
                cases![waiting::cancelled_acquire_leaves_no_holder]
            }
            Flaw::ClientDropEndsLeases => cases![renewal::lease_outlives_its_client_handle],
            Flaw::LostSignalForgottenOnReconnect => cases![faults::lost_fires_after_a_reconnect],
            Flaw::RestartForgetsLocks => cases![server::a_held_lock_survives_a_backend_restart],
            Flaw::ExpiresByTimeOfDay | Flaw::ClockBehindKeepsLocks => {
                cases![server::a_step_of_the_servers_clock_does_not_move_expiry]
            }
            Flaw::TokensFollowTheClock => cases![server::tokens_do_not_follow_the_servers_clock],
            Flaw::BackendKeyIgnoresName | Flaw::BackendKeyTruncated => {
                cases![inspect::backend_key_is_the_locks_own]
            }
            Flaw::TokenChangesOnRenew => cases![fencing::token_is_the_grants_for_its_life],
            Flaw::MinTtlRefused | Flaw::MinTtlUnavailable | Flaw::MinTtlAlwaysLate => {
                cases![input::declared_min_ttl_is_granted]
            }
            Flaw::LossNotReported => cases![telemetry::a_loss_is_reported_with_its_reason],
            Flaw::HandoffNotReported => cases![telemetry::a_handoff_is_reported],
            Flaw::AcquireTimedFromItsEnd => {
                cases![telemetry::acquisitions_renewals_and_releases_are_reported]
            }
            Flaw::ManualRenewalsUncounted => {
                cases![telemetry::acquisitions_renewals_and_releases_are_reported]
            }
            Flaw::LeaseReportsAsAnotherBackend => cases![
                telemetry::a_partitioned_lease_is_reported_at_risk_then_lost,
                telemetry::a_cut_session_is_reported_lost_as_connection_closed
            ],
            Flaw::BusyReportedAsGranted => {
                cases![telemetry::acquisitions_renewals_and_releases_are_reported]
            }
            Flaw::LostReplyLeavesGrant => cases![faults::lost_reply_leaves_no_orphan],
            Flaw::FailedReleaseLeftToTtl => cases![
                faults::failed_release_still_frees,
                faults::dropped_lease_still_frees_after_a_lost_release
            ],
            Flaw::DroppedReleaseSentOnce => {
                cases![faults::dropped_lease_still_frees_after_a_lost_release]
            }
            Flaw::CancelledRenewLeavesAtRisk => {
                cases![renewal::cancelled_renew_leaves_the_lease_held]
            }
            Flaw::WatchdogRenewsLate | Flaw::WatchdogSpins => {
                cases![renewal::watchdog_renews_at_about_a_third_of_the_ttl]
            }
            Flaw::BlocksTheRuntime | Flaw::WatchdogBlocksTheRuntime => {
                cases![runtime::no_call_blocks_the_runtime]
            }
            Flaw::BlocksOnReconnect => {
                cases![runtime::no_call_blocks_the_runtime_under_faults]
            }
            Flaw::SessionLostByPolling => cases![
                faults::dropped_connection_is_lost_at_once,
                safety::history_is_clean
            ],
            // Only a history under faults shows these: the suite's `checker::` trials run
            // the safety case's workload on them, seeded, until it does.
            Flaw::CutGrantsTwoWaiters
            | Flaw::DeadlineHangsOnOneClient
            | Flaw::CutGrantsPermitBeyondK => {
                cases![safety::history_is_clean]
            }
            Flaw::IntermittentRepeatedToken
            | Flaw::IntermittentOverstatedValidity
            | Flaw::IntermittentLostWakeup
            | Flaw::IntermittentSilentLoss => cases![repeated::every_grant_keeps_its_promises],
            Flaw::TryAcquireJumpsQueue => cases![waiting::try_acquire_never_jumps_the_queue],
            Flaw::BrokenRenewExtendsSameClient => {
                cases![ownership::broken_lease_renew_does_not_extend_the_clients_new_lease]
            }
            Flaw::CancelledWaiterKeepsItsPlace | Flaw::CancelledWaiterKeepsItsGrant => {
                cases![waiting::cancelled_waiter_in_flight_leaves_nothing]
            }
            Flaw::BornLostHandedOut => {
                cases![expiry::a_grant_that_arrives_expired_is_not_handed_out]
            }
            Flaw::WaiterValidityFromReply | Flaw::AutoRenewValidityFromReply => {
                cases![expiry::valid_until_counts_from_before_the_request]
            }
            Flaw::BackendKeyWithoutNamespace => {
                cases![inspect::backend_key_exists_on_the_server]
            }
            Flaw::RegrantKeepsToken => cases![fencing::tokens_increase_on_a_same_client_regrant],
            Flaw::InspectShowsNewestToken => cases![inspect::inspect_reports_the_holder],
            Flaw::RenewInDriftRevives => {
                cases![renewal::renew_at_valid_until_fails_though_the_server_still_has_the_lock]
            }
            Flaw::SharedIsExclusive => cases![shared::shared_holders_overlap],
            Flaw::HoldersShowsOne => {
                cases![shared::shared_holders_overlap, permits::at_most_k_holders]
            }
            Flaw::FamilyKeysSeparate => cases![
                shared::exclusive_excludes_shared,
                shared::shared_excludes_exclusive,
                permits::permits_and_other_modes_exclude
            ],
            Flaw::ReadersJumpWriters => cases![shared::waiting_writer_is_not_starved],
            Flaw::FamilyNeverExpires => cases![
                shared::abandoned_shared_lease_frees_after_ttl,
                permits::abandoned_permit_comes_back
            ],
            Flaw::StaleReleaseFreesAll => cases![
                shared::stale_shared_release_keeps_the_others,
                permits::stale_release_keeps_the_successors_permit
            ],
            Flaw::CancelledFamilyWaiterStays => cases![
                shared::cancelled_shared_waiter_leaves_nothing,
                permits::cancelled_permit_waiter_leaves_nothing
            ],
            Flaw::TokensPerMode => cases![shared::tokens_increase_across_modes],
            Flaw::PermitTokensWrap => cases![permits::tokens_increase_across_permits],
            Flaw::FamilyWaiterPolls => cases![
                shared::shared_waiting_is_idle,
                permits::permit_waiting_is_idle
            ],
            Flaw::FamilyMissedWakeup => cases![
                shared::exclusive_excludes_shared,
                permits::released_permit_goes_to_a_waiter
            ],
            Flaw::PermitsOffByOne => cases![permits::at_most_k_holders],
            Flaw::PermitCountIgnored => cases![permits::permit_count_mismatch_is_refused],
            Flaw::MismatchOnlyWithHolders => cases![permits::permit_count_mismatch_with_a_waiter],
            Flaw::ModeServedExclusive => cases![input::undeclared_modes_are_unsupported],
            Flaw::ValueNotStored => cases![election::leader_reports_value_and_term],
            Flaw::LeaderIsNewestCandidate => cases![election::one_leader_at_a_time],
            Flaw::ProclaimIgnored => cases![
                election::leader_reports_value_and_term,
                election::observer_sees_each_leader_in_order
            ],
            Flaw::ProclaimUnchecked => cases![election::proclaim_after_the_end_changes_nothing],
            Flaw::FeedSilent => cases![election::observer_sees_each_leader_in_order],
            Flaw::ObserverPolls => cases![election::observing_is_idle],
            Flaw::ElectionUndeclared => cases![input::undeclared_modes_are_unsupported],
            Flaw::LeaderNeverGone => cases![
                election::leader_reports_value_and_term,
                safety::history_is_clean
            ],
            Flaw::HangsWhileUnreachable => cases![
                faults::unreachable_backend_is_an_error,
                faults::cut_off_holder_gets_answers_not_hangs,
                security::silent_server_is_a_retryable_error
            ],
        }
    }
}
