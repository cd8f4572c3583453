//! The file system an output directory lives on (`/proc/self/mountinfo`), recorded beside
//! figures that depend on it: a snapshot written to tmpfs runs at the speed of the tmpfs's
//! page allocation, which a `huge=` mount option changes several-fold (docs/snapshot.md,
//! "Where to write a snapshot fast").

use std::path::{Component, Path};

/// The mount a path is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: String,
    pub fs_type: String,
    /// The per-mount and the file system's options, as `mountinfo` lists them.
    pub options: String,
}

impl Mount {
    /// The value of option `key` (e.g. tmpfs's `huge`), if set.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options
            .split(',')
            .find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
    }

    /// For a summary.json.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "mount_point": self.mount_point,
            "type": self.fs_type,
            "options": self.options,
            "huge": self.option("huge"),
        })
    }

    /// `tmpfs huge=always at /dev/shm`, for a summary line.
    pub fn describe(&self) -> String {
        match self.option("huge") {
            Some(h) => format!("{} huge={h} at {}", self.fs_type, self.mount_point),
            None => format!("{} at {}", self.fs_type, self.mount_point),
        }
    }
}

/// The mount `path` (made absolute and resolved) is on, from this process's `mountinfo`.
pub fn of(path: &Path) -> Option<Mount> {
    let path = std::fs::canonicalize(path).ok()?;
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    find(&String::from_utf8_lossy(&info), &path)
}

/// Octal escapes of `mountinfo` (`\040` for a space) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if b[i] == b'\\'
            && let Some(d) = octal
            && let Ok(v) = u8::from_str_radix(&String::from_utf8_lossy(d), 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The deepest mount point holding `path` (of equal ones the last listed: it covers the
/// others).
fn find(info: &str, path: &Path) -> Option<Mount> {
    let mut best: Option<(usize, Mount)> = None;
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        let (Some(mp), Some(opts), Some(ty)) = (l.get(4), l.get(5), r.first()) else {
            continue;
        };
        let mp = unescape(mp);
        let mpath = Path::new(&mp);
        if !path.starts_with(mpath) {
            continue;
        }
        let depth = mpath
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .count();
        if best.as_ref().is_none_or(|(d, _)| depth >= *d) {
            let options = match r.get(2) {
                Some(sup) => format!("{opts},{sup}"),
                None => opts.to_string(),
            };
            best = Some((
                depth,
                Mount {
                    mount_point: mp,
                    fs_type: ty.to_string(),
                    options,
                },
            ));
        }
    }
    best.map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
30 22 0:26 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,size=24683656k
41 22 0:40 / /tmp/snap\\040dir rw,relatime shared:9 - tmpfs tmpfs rw,size=4194304k,huge=always
42 22 0:41 / /dev/shm rw,relatime shared:10 - tmpfs tmpfs rw,size=1024k,huge=advise
";

    #[test]
    fn the_deepest_and_last_mount_holding_the_path_is_found_with_its_options() {
        let m = find(INFO, Path::new("/tmp/snap dir/out/x")).unwrap();
        assert_eq!(m.mount_point, "/tmp/snap dir");
        assert_eq!(
            (m.fs_type.as_str(), m.option("huge")),
            ("tmpfs", Some("always"))
        );
        assert_eq!(m.describe(), "tmpfs huge=always at /tmp/snap dir");
        // /dev/shm is mounted twice: the later mount covers the earlier.
        let m = find(INFO, Path::new("/dev/shm/a")).unwrap();
        assert_eq!(m.option("huge"), Some("advise"));
        let m = find(INFO, Path::new("/work/out")).unwrap();
        assert_eq!((m.mount_point.as_str(), m.fs_type.as_str()), ("/", "ext4"));
        assert_eq!(m.option("huge"), None);
        assert_eq!(m.describe(), "ext4 at /");
        // Not a prefix by components: /tmp/snap is not under /tmp/snap dir.
        assert_eq!(find(INFO, Path::new("/tmp/snap")).unwrap().mount_point, "/");
        assert!(find("garbage\n", Path::new("/")).is_none());
        // A backslash before anything but three octal digits stays as it is.
        assert_eq!(unescape("a\\é\\04\\040b"), "a\\é\\04 b");
    }

    #[test]
    fn this_process_finds_the_mount_of_its_working_directory() {
        let m = of(Path::new(".")).unwrap();
        assert!(!m.fs_type.is_empty() && m.mount_point.starts_with('/'));
    }
}
