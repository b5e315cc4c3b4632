//! A plain text table.

/// A titled table of strings, rendered with aligned columns (and as Markdown for the docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// The title: what was measured and its configuration.
    pub title: String,
    /// Column headers.
    pub headers: Vec<String>,
    /// Rows (as many cells as headers).
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table.
    #[must_use]
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Self {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Aligned text.
    #[must_use]
    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let mut width: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate().take(cols) {
                let pad = width[i] - c.chars().count();
                if i > 0 {
                    s.push_str("  ");
                }
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            }
            s.trim_end().to_owned()
        };
        let mut out = format!("{}\n{}\n", self.title, line(&self.headers));
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }

    /// A Markdown table under a bold title.
    #[must_use]
    pub fn markdown(&self) -> String {
        let mut out = format!("**{}**\n\n| {} |\n|", self.title, self.headers.join(" | "));
        out.push_str(&"---|".repeat(self.headers.len()));
        out.push('\n');
        for r in &self.rows {
            out.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_markdown_has_every_row() {
        let mut t = Table::new("t", &["a", "long header"]);
        t.row(vec!["wide cell".into(), "1".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "a          long header");
        assert_eq!(lines[2], "wide cell  1");
        assert_eq!(
            t.markdown().lines().filter(|l| l.starts_with('|')).count(),
            3
        );
    }
}
