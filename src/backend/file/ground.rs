//! What the lock directory stands on: its filesystem, found by `statfs`, and what `flock(2)`
//! guarantees there (docs/backends.md, "File: the filesystem"). A local filesystem keeps flock
//! in this kernel; a network or FUSE one may keep it only on this host, or lose it without the
//! holder being told. A run warns once for those, and refuses (exit 78) where flock does not
//! even exclude a second open file on this host.
//!
//! The run's cost on a local filesystem is one `statfs`; the rest (the mount's options, a probe
//! of flock) is only done on the others.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::backend::ground::{Finding, Verdict};
use crate::sys;

/// The check's name, as `dlock doctor` prints it.
pub(super) const CHECK: &str = "filesystem";

/// What flock is on a filesystem, by the class of its `statfs` magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// A disk or memory filesystem of this kernel: flock is kept here.
    Local,
    /// overlayfs (containers): flock is on the overlay's file, kept by this kernel.
    Overlay,
    /// NFS: whole-file byte-range locks on the server (since Linux 2.6.12).
    Nfs,
    /// CIFS/SMB: local before Linux 5.5, mandatory whole-file SMB locks since.
    Smb,
    /// FUSE (incl. virtiofs): the daemon's if it implements locks, this kernel's otherwise.
    Fuse,
    /// 9p: taken here and passed on to a server that may not keep it.
    NineP,
    /// A cluster filesystem whose flock holds across nodes while a node stays in.
    Cluster,
    /// Another network filesystem.
    Network,
    /// A magic number dlock does not know.
    Unknown,
}

/// The filesystems dlock knows, by `statfs` magic (linux/magic.h and the filesystems' sources).
const TABLE: &[(u32, &str, Class)] = &[
    (0xEF53, "ext4", Class::Local),
    (0x5846_5342, "xfs", Class::Local),
    (0x9123_683E, "btrfs", Class::Local),
    (0x0102_1994, "tmpfs", Class::Local),
    (0x8584_58F6, "ramfs", Class::Local),
    (0xF2F5_2010, "f2fs", Class::Local),
    (0x2FC1_2FC1, "zfs", Class::Local),
    (0xCA45_1A4E, "bcachefs", Class::Local),
    (0x3153_464A, "jfs", Class::Local),
    (0x5265_4973, "reiserfs", Class::Local),
    (0x3434, "nilfs2", Class::Local),
    (0x4D44, "vfat", Class::Local),
    (0x2011_BAB0, "exfat", Class::Local),
    (0x5346_544E, "ntfs", Class::Local),
    (0x7366_746E, "ntfs3", Class::Local),
    (0xF15F, "ecryptfs", Class::Local),
    (0x794C_7630, "overlayfs", Class::Overlay),
    (0x6969, "nfs", Class::Nfs),
    (0xFF53_4D42, "cifs", Class::Smb),
    (0xFE53_4D42, "smb3", Class::Smb),
    (0x517B, "smbfs", Class::Smb),
    (0x6573_5546, "fuse", Class::Fuse),
    (0x0102_1997, "9p", Class::NineP),
    (0x00C3_6400, "ceph", Class::Cluster),
    (0x0116_1970, "gfs2", Class::Cluster),
    (0x7461_636F, "ocfs2", Class::Cluster),
    (0x0BD0_0BD0, "lustre", Class::Cluster),
    (0x6B41_4653, "afs", Class::Network),
    (0x5346_414F, "openafs", Class::Network),
    (0x7375_7245, "coda", Class::Network),
    (0x2003_0528, "orangefs", Class::Network),
];

/// A filesystem's name and class from its magic.
pub(super) fn classify(magic: u32) -> (&'static str, Class) {
    TABLE
        .iter()
        .find(|(m, ..)| *m == magic)
        .map_or(("", Class::Unknown), |&(_, name, class)| (name, class))
}

/// The run's check of `dir`: `None` on a local filesystem or overlayfs (one `statfs`), else the
/// finding (see [`judge`]), or an unsafe one if flock does not exclude here ([`probe`]). A
/// `statfs` that fails says nothing: opening the lock file reports what is wrong with the
/// directory.
pub(super) fn for_run(dir: &Path) -> Option<Finding> {
    let magic = sys::fs_type(dir).ok()?;
    match classify(magic).1 {
        Class::Local | Class::Overlay | Class::Unknown => None,
        _ => {
            let (fstype, options) = mount_of(dir, magic);
            Some(match probed(dir, &fstype) {
                Some(bad) if bad.verdict == Verdict::Unsafe => bad,
                _ => verdict(
                    classify(magic).1,
                    &fstype,
                    &options,
                    magic,
                    kernel_release().as_deref(),
                ),
            })
        }
    }
}

/// `dlock doctor`'s checks of `dir`'s filesystem: what it is and what flock is there, and
/// whether flock excludes a second open file on this host.
pub(super) fn doctor(dir: &Path) -> Vec<Finding> {
    let magic = match sys::fs_type(dir) {
        Ok(m) => m,
        Err(e) => {
            return vec![Finding::unknown(
                CHECK,
                format!("statfs {}: {e}", dir.display()),
            )];
        }
    };
    let (fstype, options) = mount_of(dir, magic);
    let kernel = kernel_release();
    vec![
        verdict(
            classify(magic).1,
            &fstype,
            &options,
            magic,
            kernel.as_deref(),
        ),
        probed(dir, &fstype).unwrap_or_else(|| {
            Finding::ok(
                FLOCK,
                "an exclusive flock keeps a second open file out (tried on this host)",
            )
        }),
    ]
}

/// The name of the probe's check.
const FLOCK: &str = "flock";

/// The mount's type (its mountinfo name, else the table's) and options.
fn mount_of(dir: &Path, magic: u32) -> (String, String) {
    let mount = Mount::of(dir);
    let fstype = mount
        .as_ref()
        .map(|m| m.fstype.clone())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| classify(magic).0.to_string());
    (fstype, mount.map(|m| m.options).unwrap_or_default())
}

/// [`probe`]'s finding where it is not a plain "excludes": unsafe if flock locks nothing here or
/// fails, unknown if no probe file could be made.
fn probed(dir: &Path, fstype: &str) -> Option<Finding> {
    let fix = "put the lock directory on a local filesystem (DLOCK_URL=file:///local/dir)";
    match probe(dir) {
        Probe::Excludes => None,
        Probe::NotMade(e) => Some(Finding::unknown(
            FLOCK,
            format!("cannot make a probe file in {}: {e}", dir.display()),
        )),
        Probe::DoesNotExclude => Some(Finding::unsafe_(
            FLOCK,
            format!(
                "{fstype}: flock on {} does not exclude a second open file even on this host",
                dir.display()
            ),
            fix,
        )),
        Probe::Fails(e) => Some(Finding::unsafe_(
            FLOCK,
            format!("{fstype}: flock fails on {}: {e}", dir.display()),
            fix,
        )),
    }
}

/// The verdict for a class of filesystem, its mount's type and options, and the kernel's
/// release (for SMB); flock already seen to exclude on this host where it matters.
pub(super) fn verdict(
    class: Class,
    fstype: &str,
    options: &str,
    magic: u32,
    kernel: Option<&str>,
) -> Finding {
    let local_dir = "put the lock directory on a local filesystem, or use a network backend (etcd, ZooKeeper, Redis) for locks across hosts";
    let has = |o: &str| options.split(',').any(|x| x == o);
    match class {
        Class::Local => Finding::ok(CHECK, format!("{fstype}: flock is kept by this kernel")),
        Class::Overlay => Finding::ok(
            CHECK,
            format!(
                "{fstype}: flock is kept by this kernel, on the overlay's file (locks are shared only by users of this overlay mount)"
            ),
        ),
        Class::Nfs if has("local_lock=flock") || has("local_lock=all") || has("nolock") => {
            Finding::warn(
                CHECK,
                format!(
                    "{fstype} mounted with {}: flock is local to this host; other clients of the share do not see these locks",
                    if has("nolock") {
                        "nolock"
                    } else {
                        "local_lock"
                    }
                ),
                format!("mount with local_lock=none (and lock), or {local_dir}"),
            )
        }
        Class::Nfs => Finding::warn(
            CHECK,
            format!(
                "{fstype}: flock is a whole-file byte-range lock on the server, which holds across clients, but a client cut off from the server past its lease (NFSv4: 90 s by default), or a server restart it cannot reclaim in, loses the lock without its holder being told"
            ),
            local_dir,
        ),
        Class::Smb if has("nobrl") || !release_at_least(kernel, 5, 5) => Finding::warn(
            CHECK,
            format!(
                "{fstype}{}: flock is local to this host; other clients of the share do not see these locks",
                if has("nobrl") {
                    " mounted with nobrl"
                } else {
                    " on Linux before 5.5"
                }
            ),
            local_dir,
        ),
        Class::Smb => Finding::warn(
            CHECK,
            format!(
                "{fstype}: flock is a mandatory whole-file SMB lock on the server, which holds across clients, but a reconnect after a cut-off may lose it without its holder being told (and others cannot read a held lock file: status shows no holder details)"
            ),
            local_dir,
        ),
        Class::Fuse => Finding::warn(
            CHECK,
            format!(
                "FUSE ({fstype}): flock is kept by the filesystem's daemon if it implements locks, by this kernel otherwise; dlock cannot tell which: processes that reach the same files another way (another host, the underlying directory) may not be excluded"
            ),
            local_dir,
        ),
        Class::NineP => Finding::warn(
            CHECK,
            format!(
                "{fstype}: flock is kept by this kernel and passed on to the 9p server, which may not keep it (QEMU's does not): processes outside this host may not be excluded"
            ),
            local_dir,
        ),
        Class::Cluster => Finding::warn(
            CHECK,
            format!(
                "{fstype}: flock holds across the cluster's nodes while this node stays in it; a node cut off and evicted loses its locks without its holder being told"
            ),
            local_dir,
        ),
        Class::Network => Finding::warn(
            CHECK,
            format!("{fstype}: a network filesystem where flock may be local to this host"),
            local_dir,
        ),
        Class::Unknown => Finding::unknown(
            CHECK,
            format!(
                "filesystem type {magic:#x} ({fstype}): dlock does not know how flock behaves there"
            ),
        ),
    }
}

/// Whether a kernel release string ("6.1.0-18-amd64") is at least `major.minor`; true when it
/// cannot be read (then the newer behaviour is assumed: both are warned about).
fn release_at_least(release: Option<&str>, major: u32, minor: u32) -> bool {
    let Some(r) = release else { return true };
    let mut parts = r.split(|c: char| !c.is_ascii_digit());
    let (Some(Ok(a)), Some(Ok(b))) = (
        parts.next().map(str::parse::<u32>),
        parts.next().map(str::parse::<u32>),
    ) else {
        return true;
    };
    (a, b) >= (major, minor)
}

fn kernel_release() -> Option<String> {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    Some(r.trim().to_string())
}

/// What [`probe`] saw.
#[derive(Debug)]
pub(super) enum Probe {
    /// A second open file of a flocked file could not take the lock.
    Excludes,
    /// It could: flock locks nothing here.
    DoesNotExclude,
    /// flock itself failed (ENOLCK: no lock manager).
    Fails(io::Error),
    /// The probe file could not be made.
    NotMade(io::Error),
}

/// Whether an exclusive flock on a file in `dir` keeps a second open file of it out, on this
/// host: a fresh, hidden file (unlinked at once) opened twice (the second time through
/// `/proc/self/fd`, so both are the same inode whatever else happens in `dir`).
pub(super) fn probe(dir: &Path) -> Probe {
    use std::os::fd::AsRawFd;
    let path = dir.join(format!(".dlock-probe-{}", std::process::id()));
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path);
    let first = match opened {
        Ok(f) => f,
        Err(e) => return Probe::NotMade(e),
    };
    let _ = std::fs::remove_file(&path);
    let second = File::options()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", first.as_raw_fd()));
    let second = match second {
        Ok(f) => f,
        Err(e) => return Probe::NotMade(e),
    };
    if let Err(e) = sys::flock(&first, libc::LOCK_EX | libc::LOCK_NB) {
        return Probe::Fails(e);
    }
    match sys::flock(&second, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => Probe::DoesNotExclude,
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Probe::Excludes,
        Err(e) => Probe::Fails(e),
    }
}

/// A mount as /proc/self/mountinfo describes it.
#[derive(Debug, PartialEq, Eq)]
struct Mount {
    fstype: String,
    /// The mount's and the superblock's options, comma-separated.
    options: String,
}

impl Mount {
    /// The mount that holds `dir`, found by its device number.
    fn of(dir: &Path) -> Option<Mount> {
        let dev = std::fs::metadata(dir).ok()?.dev();
        let (major, minor) = (dev_major(dev), dev_minor(dev));
        let text = read_bounded("/proc/self/mountinfo", 8 << 20)?;
        text.lines().find_map(|l| parse_mountinfo(l, major, minor))
    }
}

/// glibc's `major()` of a `dev_t`.
fn dev_major(dev: u64) -> u64 {
    ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff)
}

/// glibc's `minor()` of a `dev_t`.
fn dev_minor(dev: u64) -> u64 {
    (dev & 0xff) | ((dev >> 12) & !0xff)
}

fn read_bounded(path: &str, max: u64) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    File::open(path)
        .ok()?
        .take(max)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// One line of mountinfo, if it is of device `major:minor`: "36 35 0:52 / /mnt rw,relatime
/// shared:1 - nfs4 srv:/x rw,vers=4.2,local_lock=none,...".
fn parse_mountinfo(line: &str, major: u64, minor: u64) -> Option<Mount> {
    let mut fields = line.split(' ');
    let dev = fields.nth(2)?;
    let (a, b) = dev.split_once(':')?;
    if a.parse::<u64>().ok()? != major || b.parse::<u64>().ok()? != minor {
        return None;
    }
    let mount_options = fields.nth(2)?;
    let mut rest = fields.skip_while(|f| *f != "-").skip(1);
    let fstype = rest.next()?.to_string();
    let super_options = rest.nth(1).unwrap_or("");
    Some(Mount {
        fstype,
        options: format!("{mount_options},{super_options}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_numbers_name_their_filesystems() {
        assert_eq!(classify(0xEF53), ("ext4", Class::Local));
        assert_eq!(classify(0x0102_1994), ("tmpfs", Class::Local));
        assert_eq!(classify(0x794C_7630).1, Class::Overlay);
        assert_eq!(classify(0x6969).1, Class::Nfs);
        assert_eq!(classify(0xFF53_4D42).1, Class::Smb);
        assert_eq!(classify(0xFE53_4D42).1, Class::Smb);
        assert_eq!(classify(0x6573_5546).1, Class::Fuse);
        assert_eq!(classify(0x0102_1997).1, Class::NineP);
        assert_eq!(classify(0x00C3_6400).1, Class::Cluster);
        assert_eq!(classify(0x1234_5678), ("", Class::Unknown));
        // Every magic is listed once.
        for (i, (m, ..)) in TABLE.iter().enumerate() {
            assert!(TABLE[i + 1..].iter().all(|(n, ..)| n != m), "{m:#x}");
        }
    }

    fn judged(class: Class, fstype: &str, options: &str, kernel: &str) -> Finding {
        verdict(class, fstype, options, 0, Some(kernel))
    }

    #[test]
    fn each_class_gets_its_verdict() {
        assert_eq!(
            judged(Class::Local, "ext4", "rw", "6.1").verdict,
            Verdict::Ok
        );
        assert_eq!(
            judged(Class::Overlay, "overlay", "rw", "6.1").verdict,
            Verdict::Ok
        );
        let nfs = judged(Class::Nfs, "nfs4", "rw,vers=4.2,local_lock=none", "6.1");
        assert_eq!(nfs.verdict, Verdict::Warn);
        assert!(nfs.found.contains("past its lease"), "{}", nfs.found);
        for opt in ["local_lock=flock", "local_lock=all", "nolock"] {
            let f = judged(Class::Nfs, "nfs", &format!("rw,{opt}"), "6.1");
            assert_eq!(f.verdict, Verdict::Warn);
            assert!(f.found.contains("local to this host"), "{}", f.found);
        }
        let old_smb = judged(Class::Smb, "cifs", "rw", "5.4.0-150-generic");
        assert!(old_smb.found.contains("before 5.5"), "{}", old_smb.found);
        let smb = judged(Class::Smb, "cifs", "rw", "6.1.0");
        assert!(smb.found.contains("mandatory"), "{}", smb.found);
        let nobrl = judged(Class::Smb, "cifs", "rw,nobrl", "6.1.0");
        assert!(nobrl.found.contains("nobrl"), "{}", nobrl.found);
        let fuse = judged(Class::Fuse, "fuse.sshfs", "rw", "6.1");
        assert_eq!(fuse.verdict, Verdict::Warn);
        assert!(
            fuse.found.starts_with("FUSE (fuse.sshfs)"),
            "{}",
            fuse.found
        );
        for class in [Class::NineP, Class::Cluster, Class::Network] {
            assert_eq!(judged(class, "x", "rw", "6.1").verdict, Verdict::Warn);
        }
        let unknown = verdict(Class::Unknown, "", "", 0x1234, None);
        assert_eq!(unknown.verdict, Verdict::Unknown);
        assert!(unknown.found.contains("0x1234"));
    }

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(release_at_least(Some("5.5.0"), 5, 5));
        assert!(release_at_least(Some("6.1.0-18-amd64"), 5, 5));
        assert!(!release_at_least(Some("5.4.0-150-generic"), 5, 5));
        assert!(!release_at_least(Some("4.19"), 5, 5));
        assert!(release_at_least(Some("garbage"), 5, 5));
        assert!(release_at_least(None, 5, 5));
    }

    #[test]
    fn mountinfo_lines_give_type_and_options() {
        let line = "36 35 0:52 / /mnt/share rw,relatime shared:1 - nfs4 srv:/x rw,vers=4.2,local_lock=none";
        assert_eq!(
            parse_mountinfo(line, 0, 52),
            Some(Mount {
                fstype: "nfs4".into(),
                options: "rw,relatime,rw,vers=4.2,local_lock=none".into()
            })
        );
        assert_eq!(parse_mountinfo(line, 0, 53), None);
        let no_optional = "42 27 0:39 / /tmp/m rw,nosuid - fuse /src rw,user_id=0";
        assert_eq!(parse_mountinfo(no_optional, 0, 39).unwrap().fstype, "fuse");
        for junk in ["", "1 2", "1 2 x:y / /", "1 2 0:1 / / rw"] {
            assert_eq!(parse_mountinfo(junk, 0, 1), None, "{junk}");
        }
    }

    #[test]
    fn device_numbers_split_as_glibc_does() {
        // makedev(259, 3) and makedev(0, 1048577).
        assert_eq!((dev_major(0x10303), dev_minor(0x10303)), (259, 3));
        let big: u64 = (1_048_577 & 0xff) | ((1_048_577 & !0xff) << 12);
        assert_eq!((dev_major(big), dev_minor(big)), (0, 1_048_577));
    }

    #[test]
    fn flock_excludes_on_the_local_temp_dir() {
        let dir = std::env::temp_dir();
        assert!(matches!(probe(&dir), Probe::Excludes));
        let magic = sys::fs_type(&dir).unwrap();
        assert_ne!(magic, 0);
    }
}
