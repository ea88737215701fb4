//! NM → FHIR decimal: which values are decimals, and their JSON form.

/// True for a decimal FHIR (and JSON) accept once normalised: optional sign, digits, optional fraction.
pub(crate) fn is_decimal(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    (!int.is_empty() || !frac.is_empty())
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
}

/// A v2 NM (checked by [`is_decimal`]) as a JSON number: no `+`, no leading zeros, a digit on each side of
/// the point.
pub(crate) fn normalise_decimal(s: &str) -> std::borrow::Cow<'_, str> {
    // Most values are written so already: borrowed as they are.
    let unsigned = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = unsigned
        .split_once('.')
        .map_or((unsigned, None), |(i, f)| (i, Some(f)));
    if !int.is_empty()
        && (int == "0" || !int.starts_with('0'))
        && frac.is_none_or(|f| !f.is_empty())
        && int
            .bytes()
            .chain(frac.unwrap_or_default().bytes())
            .all(|b| b.is_ascii_digit())
    {
        return std::borrow::Cow::Borrowed(s);
    }
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int = int.trim_start_matches('0');
    let mut out = String::with_capacity(s.len() + 1);
    if neg {
        out.push('-');
    }
    out.push_str(if int.is_empty() { "0" } else { int });
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    std::borrow::Cow::Owned(out)
}
