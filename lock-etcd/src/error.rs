//! etcd client errors mapped onto the contract's error variants, without the password.

use lock_core::driver::scrub;
use lock_core::Error;

use crate::lock::BACKEND;
use crate::EtcdConfig;

pub(crate) fn malformed(what: &str) -> Error {
    Error::backend(BACKEND, format!("unexpected {what} transaction response"))
}

pub(crate) fn connect_error(e: etcd_client::Error, config: &EtcdConfig) -> Error {
    match map_error(e, config) {
        Error::Unavailable { .. } => Error::unavailable(
            BACKEND,
            format!("cannot connect to {}", config.redacted_url()),
        ),
        other => other,
    }
}

pub(crate) fn map_error(e: etcd_client::Error, config: &EtcdConfig) -> Error {
    use etcd_client::Error as E;
    use tonic::Code;
    let text = scrub(&e, config.secret());
    match &e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Cancelled
            | Code::Unknown => {
                Error::unavailable(BACKEND, format!("{text} ({})", config.redacted_url()))
            }
            // etcd reports a wrong password, or none where auth is on, as InvalidArgument.
            Code::InvalidArgument
                if s.message().contains("authentication failed")
                    || s.message().contains("user name is empty") =>
            {
                Error::unauthenticated(
                    BACKEND,
                    format!(
                        "etcd rejected the credentials of user {:?}: {text}",
                        config.user().unwrap_or("")
                    ),
                )
            }
            Code::Unauthenticated | Code::PermissionDenied => Error::unauthenticated(
                BACKEND,
                format!(
                    "etcd refused access for user {:?}: {text}",
                    config.user().unwrap_or("")
                ),
            ),
            _ => Error::backend(BACKEND, format!("{text} ({})", config.redacted_url())),
        },
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => {
            Error::unavailable(BACKEND, format!("{text} ({})", config.redacted_url()))
        }
        _ => Error::backend(BACKEND, format!("{text} ({})", config.redacted_url())),
    }
}
