//! The processes of a command, as `/proc` shows them: the keeper and, after the keeper's death,
//! distlock itself look here for what is left to kill.

use nix::unistd::Pid;

/// One process, from `/proc/PID/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Proc {
    pub(crate) pid: Pid,
    pub(crate) parent: Pid,
    pub(crate) group: Pid,
    /// Ended, not reaped yet: it runs nothing, but still counts as a member of its group
    /// (`kill` succeeds on it).
    pub(crate) zombie: bool,
}

/// Every process on the machine.
pub(crate) fn all() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        parse_stat(pid, &stat)
    })
    .collect()
}

/// A `/proc/PID/stat` line: `pid (comm) state ppid pgrp ...`. The command name may contain
/// spaces and parentheses, so fields count from the last `)`.
fn parse_stat(pid: i32, stat: &str) -> Option<Proc> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    Some(Proc {
        pid: Pid::from_raw(pid),
        parent: Pid::from_raw(parent),
        group: Pid::from_raw(group),
        zombie: state == "Z" || state == "X",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let p = parse_stat(42, "42 (a (b) c) S 7 9 9 0 -1").unwrap();
        assert_eq!(
            (p.parent, p.group, p.zombie),
            (Pid::from_raw(7), Pid::from_raw(9), false),
            "a command name with spaces and parentheses"
        );
        assert!(parse_stat(42, "42 (z) Z 1 9 9").unwrap().zombie);
        assert_eq!(parse_stat(42, "42 (x) S"), None);
        assert_eq!(parse_stat(42, "garbage"), None);
    }

    #[test]
    fn this_process_is_listed() {
        let me = nix::unistd::getpid();
        let listed = all().into_iter().find(|p| p.pid == me).unwrap();
        assert_eq!(listed.parent, nix::unistd::getppid());
        assert_eq!(listed.group, nix::unistd::getpgrp());
        assert!(!listed.zombie);
    }
}
