//! Which names are tokenized: per database, every field name at or above a
//! length threshold, and every key under the custom-attribute paths.

/// Tokenization settings for the databases they apply to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Names at least this many bytes long are tokenized (0: none by length).
    pub min_len: usize,
    /// Every key under these paths is tokenized, whatever its length.
    pub custom_paths: Vec<Vec<String>>,
    /// String values at these paths (array elements included) are tokenized.
    pub value_paths: Vec<Vec<String>>,
    /// Databases never tokenized (the system ones and the store's own).
    pub excluded_dbs: Vec<String>,
}

impl Policy {
    pub fn new(min_len: usize, custom_paths: &[String], store_db: &str) -> Policy {
        Policy {
            min_len,
            custom_paths: custom_paths
                .iter()
                .map(|p| p.split('.').map(str::to_owned).collect())
                .collect(),
            value_paths: Vec::new(),
            excluded_dbs: ["admin", "local", "config", store_db]
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
        }
    }

    /// Tokenizes the string values found at `paths` too.
    pub fn with_value_paths(mut self, paths: &[String]) -> Policy {
        self.value_paths = paths
            .iter()
            .map(|p| p.split('.').map(str::to_owned).collect())
            .collect();
        self
    }

    /// Whether anything is tokenized at all.
    pub fn is_active(&self) -> bool {
        self.min_len > 0 || !self.custom_paths.is_empty() || !self.value_paths.is_empty()
    }

    /// Whether the values at the logical path `path` (array indexes left
    /// out) are tokenized.
    pub fn is_value_path<S: AsRef<str>>(&self, path: &[S]) -> bool {
        self.value_paths
            .iter()
            .any(|p| p.len() == path.len() && p.iter().zip(path).all(|(a, b)| a == b.as_ref()))
    }

    /// Whether documents of `db` are tokenized.
    pub fn applies_to(&self, db: &str) -> bool {
        self.is_active() && !self.excluded_dbs.iter().any(|d| d == db)
    }

    /// Whether `key`, found under the logical path `parent`, becomes a token.
    pub fn tokenizes(&self, parent: &[&str], key: &str) -> bool {
        if key.is_empty() || key.starts_with('$') || (parent.is_empty() && key == "_id") {
            return false;
        }
        if self.min_len > 0 && key.len() >= self.min_len {
            return true;
        }
        self.custom_paths
            .iter()
            .any(|p| parent.len() >= p.len() && p.iter().zip(parent).all(|(a, b)| a == b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_and_custom_paths() {
        let p = Policy::new(8, &["custom".into(), "a.b".into()], "laconic");
        assert!(p.tokenizes(&[], "first_name"));
        assert!(!p.tokenizes(&[], "fn"));
        assert!(!p.tokenizes(&[], "_id"));
        assert!(p.tokenizes(&["custom"], "x"));
        assert!(p.tokenizes(&["custom", "deep"], "y"));
        assert!(!p.tokenizes(&["customer"], "y"));
        assert!(p.tokenizes(&["a", "b"], "c"));
        assert!(!p.tokenizes(&["a"], "c"));
        assert!(!p.tokenizes(&["custom"], "$ref"));
        assert!(p.applies_to("app") && !p.applies_to("admin") && !p.applies_to("laconic"));
        assert!(!Policy::new(0, &[], "laconic").applies_to("app"));
    }
}
