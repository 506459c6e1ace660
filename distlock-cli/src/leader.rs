//! `distlock leader`: who leads a name, once or as each change comes (`--watch`).

use std::io::Write;

use distlock::{Election, Leader, Observation};
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::LeaderArgs;
use crate::exit::{say, Failure, EX_IOERR};
use crate::target::Secrets;

pub(crate) async fn leader(a: LeaderArgs, secrets: &Secrets) -> u8 {
    let (locks, name) = match crate::connect(&a.target).await {
        Ok(x) => x,
        Err(f) => return f.report(secrets),
    };
    let backend = locks.backend();
    let election = match Election::new(locks) {
        Ok(e) => e,
        Err(error) => return failed("cannot hold elections", error).report(secrets),
    };
    let line = |o: &Observation| match a.json {
        true => json(backend, o),
        false => sentence(&name, backend, o),
    };
    if !a.watch {
        let leader = match election.leader(&name).await {
            Ok(l) => l,
            Err(error) => return failed("cannot read the leader", error).report(secrets),
        };
        let now = Observation::new(leader, false);
        return write(&line(&now), secrets);
    }
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return Failure::Supervision("cannot handle signals".into()).report(secrets);
    };
    let mut observer = match election.observe(&name).await {
        Ok(o) => o,
        Err(error) => return failed("cannot watch the leader", error).report(secrets),
    };
    loop {
        let next = tokio::select! {
            n = observer.next() => n,
            _ = int.recv() => return 0,
            _ = term.recv() => return 0,
        };
        let seen = match next {
            Ok(o) => o,
            Err(error) => return failed("cannot watch the leader", error).report(secrets),
        };
        let code = write(&line(&seen), secrets);
        if code != 0 {
            return code;
        }
    }
}

fn failed(what: &str, error: distlock::Error) -> Failure {
    Failure::Lock {
        what: what.into(),
        error,
    }
}

/// `{"value": …, "term": …, "backend": …}`, with `resynced` when the observer re-read after a
/// gap; value and term null when nobody leads. A value that is not UTF-8 is shown lossily.
fn json(backend: &str, o: &Observation) -> String {
    let l: Option<&Leader> = o.leader.as_ref();
    let mut v = serde_json::json!({
        "value": l.map(|l| l.value.to_string()),
        "term": l.map(|l| l.term.get()),
        "backend": backend,
    });
    if o.resynced {
        v["resynced"] = serde_json::Value::Bool(true);
    }
    format!("{v}\n")
}

/// `NAME: led by VALUE (term N, BACKEND backend)`, or `no leader`.
fn sentence(name: &distlock::LockName, backend: &str, o: &Observation) -> String {
    let again = if o.resynced {
        " [re-read after a gap: changes in between may not be shown]"
    } else {
        ""
    };
    match &o.leader {
        Some(l) => format!(
            "{name}: led by {} (term {}, {backend} backend){again}\n",
            l.value, l.term
        ),
        None => format!("{name}: no leader ({backend} backend){again}\n"),
    }
}

/// Writes and flushes a line; a closed stdout is exit 74, as for `status`.
fn write(line: &str, secrets: &Secrets) -> u8 {
    let mut out = std::io::stdout();
    match out.write_all(line.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) => {
            say(secrets, &format!("cannot write the answer: {e}"));
            EX_IOERR
        }
    }
}
