//! The glob patterns routes match senders and types with (`*`, `?`), case-insensitive.

/// A glob (`*` any run of characters, `?` one character, everything else itself) compiled once, when its route is: literals and `prefix*` compare bytes, the rest walks characters.
#[derive(Debug, Clone)]
pub struct Glob {
    /// The pattern as written.
    pub pattern: String,
    pub(super) kind: GlobKind,
}

#[derive(Debug, Clone)]
pub(super) enum GlobKind {
    Literal,
    /// `text*` with no other wildcard.
    Prefix(usize),
    Chars(Vec<char>),
}

impl Glob {
    /// Compiles `pattern`.
    pub fn new(pattern: &str) -> Self {
        let wild = |c: char| c == '*' || c == '?';
        let kind = match pattern.find(wild) {
            None => GlobKind::Literal,
            Some(i) if i + 1 == pattern.len() && pattern.ends_with('*') => GlobKind::Prefix(i),
            Some(_) => GlobKind::Chars(pattern.chars().collect()),
        };
        Self {
            pattern: pattern.to_owned(),
            kind,
        }
    }

    /// True when the pattern has no wildcard: it matches exactly one text.
    pub fn is_literal(&self) -> bool {
        matches!(self.kind, GlobKind::Literal)
    }

    /// True when `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        match &self.kind {
            GlobKind::Literal => self.pattern == text,
            GlobKind::Prefix(n) => text.as_bytes().starts_with(&self.pattern.as_bytes()[..*n]),
            GlobKind::Chars(p) => glob_chars(p, text),
        }
    }
}

pub(super) fn glob_chars(p: &[char], text: &str) -> bool {
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}
