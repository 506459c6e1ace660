//! Which backend a command talks to: the URL (given, from the environment, or the per-user
//! default directory), and the secrets in it that no output may show.

use std::path::{Path, PathBuf};

/// The backend URL: `--url`, else `$DISTLOCK_URL`, else the default directory as `file://`.
/// A default directory that is not safe to use, or a `$DISTLOCK_URL` that is set but not
/// UTF-8 (never silently replaced by the default), is a usage error (the message says why).
pub(crate) fn url_of(given: Option<&str>) -> Result<String, String> {
    if let Some(u) = given {
        return Ok(u.to_string());
    }
    match std::env::var("DISTLOCK_URL") {
        Ok(u) => return Ok(u),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err("DISTLOCK_URL is set but is not UTF-8".into())
        }
        Err(std::env::VarError::NotPresent) => {}
    }
    let dir = default_dir().map_err(|why| format!("default lock directory: {why}"))?;
    // Encoded, so that the driver decodes exactly this path: `%41`, `#`, `?` and bytes that
    // are not UTF-8 mean themselves.
    url::Url::from_directory_path(&dir)
        .map(String::from)
        .map_err(|()| format!("default lock directory {} is not absolute", dir.display()))
}

/// `$XDG_RUNTIME_DIR/distlock` when that is set (the runtime dir is the user's own, mode
/// 0700), else `$TMPDIR/distlock-<uid>`. Either way the directory is created with mode 0700,
/// and checked before every use: a directory that another user created first (to read or
/// break our locks) or that others may write is refused.
fn default_dir() -> Result<PathBuf, String> {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .map(|p| p.join("distlock"))
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("distlock-{}", nix::unistd::geteuid()))
        });
    make_private_dir(&dir)?;
    Ok(dir)
}

fn make_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    // lstat: a symlink planted in /tmp must not lead us elsewhere.
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot check {}: {e}", dir.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if !m.file_type().is_dir() {
        return Err(format!(
            "{} is not a directory (a symlink or file there is refused); remove it or give --url",
            dir.display()
        ));
    }
    if m.uid() != me {
        return Err(format!(
            "{} belongs to another user (uid {}), who could read or break the locks in it; \
             remove it or give --url",
            dir.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by others (mode {:o}); chmod 700 it or give --url",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// The secret parts of the URLs on a command line, and [`Secrets::scrub`] that hides them in
/// any text before it is printed.
///
/// The secret of a URL is everything between `scheme://` and the *last* `@`: a password may
/// contain `/`, `?`, `#`, `@` or `:` unescaped, and then no parser can tell where it ends, so
/// this errs on the side of hiding too much. Besides the whole secret, its decoded form and its
/// pieces between those characters are hidden too, so a driver that split such a URL in the
/// wrong place cannot print a piece of the password either.
#[derive(Debug, Default)]
pub(crate) struct Secrets(Vec<String>);

/// Pieces shorter than this are not hidden on their own (they would hide ordinary words).
const MIN_PIECE: usize = 4;

impl Secrets {
    /// The secrets of every argument and of `$DISTLOCK_URL`.
    pub(crate) fn from_args_and_env() -> Self {
        let mut s = Secrets::default();
        for a in std::env::args_os().chain(std::env::var_os("DISTLOCK_URL")) {
            s.add_url(&a.to_string_lossy());
        }
        s
    }

    fn add_url(&mut self, url: &str) {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let (Some(ui), _) = distlock::lock_core::driver::split_userinfo(rest) else {
            return;
        };
        let password = ui.password.unwrap_or("");
        let mut found = vec![ui.raw.to_string(), password.to_string()];
        found.push(distlock::lock_core::driver::percent_decode(password));
        found.extend(
            password
                .split(['/', '?', '#', '@', ':', '%'])
                .map(str::to_string),
        );
        for f in found {
            if f.len() >= MIN_PIECE && !self.0.contains(&f) {
                self.0.push(f);
            }
        }
        // Longest first, so a piece never breaks up a longer secret before it is replaced.
        self.0.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }

    /// `text` with every secret replaced by `***`.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.0 {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "***");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(url: &str) -> Secrets {
        let mut s = Secrets::default();
        s.add_url(url);
        s
    }

    #[test]
    fn hides_passwords_with_url_delimiters_and_their_pieces() {
        let pw = "pwA1/pwB2?pwC3#pwD4@pwE5:pwF6";
        let url = format!("redis://app:{pw}@127.0.0.1:6379/0");
        let s = secrets(&url);
        let text = format!(
            "bad {url}; host {}; port pwB2; decoded {}",
            &pw[5..],
            pw.replace('/', "%2F")
        );
        let out = s.scrub(&text);
        for piece in ["pwA1", "pwB2", "pwC3", "pwD4", "pwE5", "pwF6"] {
            assert!(!out.contains(piece), "{piece} in {out}");
        }
        assert!(out.contains("127.0.0.1:6379"), "{out}");
    }

    #[test]
    fn decoded_passwords_are_hidden_too() {
        let s = secrets("etcd://u:s%40cret%2Fpw@h:1");
        assert_eq!(s.scrub("auth failed for s@cret/pw"), "auth failed for ***");
    }

    #[test]
    fn urls_without_credentials_hide_nothing() {
        let s = secrets("etcd://h1:1,h2:2/prefix");
        assert_eq!(
            s.scrub("etcd://h1:1,h2:2/prefix"),
            "etcd://h1:1,h2:2/prefix"
        );
    }

    #[test]
    fn a_private_dir_is_made_and_a_foreign_or_open_one_refused() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("distlock-dir-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap_or_else(|e| panic!("{e}"));
        let d = base.join("mine");
        make_private_dir(&d).unwrap_or_else(|e| panic!("{e}"));
        let mode = std::fs::metadata(&d).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o700));
        make_private_dir(&d).unwrap_or_else(|e| panic!("second use: {e}"));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777))
            .unwrap_or_else(|e| panic!("{e}"));
        let e = make_private_dir(&d).expect_err("world-writable accepted");
        assert!(e.contains("writable by others"), "{e}");
        let link = base.join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap_or_else(|e| panic!("{e}"));
        let e = make_private_dir(&link).expect_err("symlink accepted");
        assert!(e.contains("not a directory"), "{e}");
        let _ = std::fs::remove_dir_all(&base);
    }
}
