//! Every Rust snippet of `docs/writing-a-driver.md` is an excerpt of this example (which
//! compiles and passes the suite), so the guide's code compiles as written. A snippet edited
//! in one place and not the other fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

const GUIDE: &str = include_str!("../../../docs/writing-a-driver.md");
const SOURCES: [(&str, &str); 7] = [
    ("src/lib.rs", include_str!("../src/lib.rs")),
    ("src/config.rs", include_str!("../src/config.rs")),
    ("src/client.rs", include_str!("../src/client.rs")),
    ("src/lock.rs", include_str!("../src/lock.rs")),
    ("src/lease.rs", include_str!("../src/lease.rs")),
    ("tests/conformance.rs", include_str!("conformance.rs")),
    ("tests/facade.rs", include_str!("facade.rs")),
];

/// Lines without surrounding whitespace, blank lines dropped: indentation may differ.
fn lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

fn rust_snippets(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```rust") => current = Some(String::new()),
            (Some(_), l) if l.starts_with("```") => out.extend(current.take()),
            (Some(s), _) => {
                s.push_str(line);
                s.push('\n');
            }
            (None, _) => {}
        }
    }
    out
}

#[test]
fn every_rust_snippet_of_the_guide_is_in_the_example() {
    let snippets = rust_snippets(GUIDE);
    assert!(
        snippets.len() >= 5,
        "found only {} Rust snippets",
        snippets.len()
    );
    for snippet in snippets {
        let want = lines(&snippet);
        let found = SOURCES.iter().any(|(_, src)| {
            let have = lines(src);
            have.windows(want.len()).any(|w| w == want.as_slice())
        });
        assert!(
            found,
            "this snippet of docs/writing-a-driver.md is not an excerpt of examples/table-driver \
             ({}):\n{snippet}",
            SOURCES.map(|(p, _)| p).join(", ")
        );
    }
}
