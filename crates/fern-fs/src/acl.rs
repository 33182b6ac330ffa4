//! POSIX access control lists (the Linux `system.posix_acl_access` / `system.posix_acl_default`
//! extended attributes). It owns their value format, their validation, and the pure rules that
//! tie an ACL to the file mode: which mode an access ACL implies, how chmod rewrites an ACL,
//! what a new node inherits from its directory's default ACL, and who an ACL lets in. It must
//! never touch the store (the xattr, namespace and setattr code do, calling these rules).
//!
//! Value format (Linux's `posix_acl_xattr`, little-endian as the kernel writes it): a header
//! `version u32 = 2`, then entries of 8 bytes `tag u16 · perm u16 · id u32`. Tags: USER_OBJ 1,
//! USER 2, GROUP_OBJ 4, GROUP 8, MASK 16, OTHER 32; `id` is meaningful for USER and GROUP only
//! (the kernel writes `u32::MAX` elsewhere, and so do we). A header without entries means "no
//! ACL" (setting it removes the attribute), as in `posix_acl_from_xattr`.
//!
//! Validity is the kernel's `posix_acl_valid`: entries in tag order USER_OBJ, USER*, GROUP_OBJ,
//! GROUP*, MASK?, OTHER, each base entry exactly once, perms within `rwx`, and a MASK whenever
//! there is a named USER or GROUP entry. Anything else is `FsError::Invalid` (EINVAL).

use crate::error::{FsError, FsResult};
use crate::perm::{Cred, MAY_EXEC, MAY_READ, MAY_WRITE};

/// Name of the access ACL attribute.
pub const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// Name of the default ACL attribute (directories only).
pub const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// Version word of the xattr format.
const VERSION: u32 = 2;
const TAG_USER_OBJ: u16 = 0x01;
const TAG_USER: u16 = 0x02;
const TAG_GROUP_OBJ: u16 = 0x04;
const TAG_GROUP: u16 = 0x08;
const TAG_MASK: u16 = 0x10;
const TAG_OTHER: u16 = 0x20;
/// The id the kernel writes for entries that carry none.
const UNDEFINED_ID: u32 = u32::MAX;

/// Who one ACL entry is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// The file's owner.
    UserObj,
    /// A named user.
    User(u32),
    /// The file's group.
    GroupObj,
    /// A named group.
    Group(u32),
    /// Upper bound of what named entries and the group entry grant.
    Mask,
    /// Everyone else.
    Other,
}

/// One entry: a tag and its `rwx` bits (0..=7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Who.
    pub tag: Tag,
    /// `rwx` as 4/2/1.
    pub perm: u32,
}

/// A valid ACL (at least the three base entries, in the kernel's order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Parses an xattr value. `Ok(None)`: a header without entries (no ACL).
    pub fn decode(v: &[u8]) -> FsResult<Option<Acl>> {
        let (head, body) = v.split_at_checked(4).ok_or(FsError::Invalid)?;
        let version = u32::from_le_bytes(head.try_into().map_err(|_| FsError::Invalid)?);
        if version != VERSION || body.len() % 8 != 0 {
            return Err(FsError::Invalid);
        }
        if body.is_empty() {
            return Ok(None);
        }
        let mut entries = Vec::with_capacity(body.len() / 8);
        for e in body.chunks_exact(8) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u32::from(u16::from_le_bytes([e[2], e[3]]));
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            let tag = match tag {
                TAG_USER_OBJ => Tag::UserObj,
                TAG_USER => Tag::User(id),
                TAG_GROUP_OBJ => Tag::GroupObj,
                TAG_GROUP => Tag::Group(id),
                TAG_MASK => Tag::Mask,
                TAG_OTHER => Tag::Other,
                _ => return Err(FsError::Invalid),
            };
            entries.push(Entry { tag, perm });
        }
        let acl = Acl { entries };
        acl.validate()?;
        Ok(Some(acl))
    }

    /// The xattr value.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 8 * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            let (tag, id) = match e.tag {
                Tag::UserObj => (TAG_USER_OBJ, UNDEFINED_ID),
                Tag::User(id) => (TAG_USER, id),
                Tag::GroupObj => (TAG_GROUP_OBJ, UNDEFINED_ID),
                Tag::Group(id) => (TAG_GROUP, id),
                Tag::Mask => (TAG_MASK, UNDEFINED_ID),
                Tag::Other => (TAG_OTHER, UNDEFINED_ID),
            };
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&(e.perm as u16).to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    /// Builds an ACL from entries, checking it as [`Acl::decode`] does.
    pub fn new(entries: Vec<Entry>) -> FsResult<Acl> {
        let acl = Acl { entries };
        acl.validate()?;
        Ok(acl)
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The kernel's `posix_acl_valid`, as a state machine over the tag order.
    fn validate(&self) -> FsResult<()> {
        #[derive(PartialEq)]
        enum State {
            UserObj,
            Users,
            Groups,
            Other,
            Done,
        }
        let mut state = State::UserObj;
        let mut needs_mask = false;
        for e in &self.entries {
            if e.perm & !7 != 0 {
                return Err(FsError::Invalid);
            }
            state = match (e.tag, state) {
                (Tag::UserObj, State::UserObj) => State::Users,
                (Tag::User(_), State::Users) => {
                    needs_mask = true;
                    State::Users
                }
                (Tag::GroupObj, State::Users) => State::Groups,
                (Tag::Group(_), State::Groups) => {
                    needs_mask = true;
                    State::Groups
                }
                (Tag::Mask, State::Groups) => State::Other,
                (Tag::Other, State::Other) => State::Done,
                (Tag::Other, State::Groups) if !needs_mask => State::Done,
                _ => return Err(FsError::Invalid),
            };
        }
        if state == State::Done {
            Ok(())
        } else {
            Err(FsError::Invalid)
        }
    }

    fn perm_of(&self, want: Tag) -> Option<u32> {
        self.entries.iter().find(|e| e.tag == want).map(|e| e.perm)
    }

    fn set_perm(&mut self, want: Tag, perm: u32) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.tag == want) {
            e.perm = perm;
        }
    }

    fn has_mask(&self) -> bool {
        self.perm_of(Tag::Mask).is_some()
    }

    /// The tag that stands for the mode's group bits: MASK when there is one, else GROUP_OBJ.
    fn group_class(&self) -> Tag {
        if self.has_mask() {
            Tag::Mask
        } else {
            Tag::GroupObj
        }
    }

    /// The `rwxrwxrwx` bits this access ACL implies for the file mode: owner from USER_OBJ,
    /// group from MASK (GROUP_OBJ without a mask), other from OTHER.
    pub fn mode_bits(&self) -> u32 {
        let get = |t| self.perm_of(t).unwrap_or(0);
        (get(Tag::UserObj) << 6) | (get(self.group_class()) << 3) | get(Tag::Other)
    }

    /// True when the mode alone says everything this ACL says (no named entries): such an
    /// access ACL is stored as the mode only (the kernel's `posix_acl_equiv_mode`).
    pub fn is_mode_only(&self) -> bool {
        !self
            .entries
            .iter()
            .any(|e| matches!(e.tag, Tag::User(_) | Tag::Group(_)))
    }

    /// chmod: the base entries follow the new `rwxrwxrwx` bits (the group bits go to MASK
    /// when there is one; named entries keep theirs), as `posix_acl_chmod`.
    pub fn chmod(&mut self, perm: u32) {
        self.set_perm(Tag::UserObj, (perm >> 6) & 7);
        self.set_perm(self.group_class(), (perm >> 3) & 7);
        self.set_perm(Tag::Other, perm & 7);
    }

    /// Whether `cred` gets `want` (a `MAY_*` mask) from this ACL on a file owned by
    /// `uid:gid`: the kernel's `posix_acl_permission`. Root is the caller's business.
    pub fn permits(&self, uid: u32, gid: u32, cred: &Cred, want: u32) -> bool {
        let want = want & (MAY_READ | MAY_WRITE | MAY_EXEC);
        let mask = self.perm_of(Tag::Mask).unwrap_or(7);
        let grants = |perm: u32| perm & want == want;
        if cred.uid == uid {
            return self.perm_of(Tag::UserObj).is_some_and(grants);
        }
        for e in &self.entries {
            if e.tag == Tag::User(cred.uid) {
                return grants(e.perm & mask);
            }
        }
        let mut found = false;
        for e in &self.entries {
            let member = match e.tag {
                Tag::GroupObj => cred.in_group(gid),
                Tag::Group(g) => cred.in_group(g),
                _ => false,
            };
            if member {
                found = true;
                if grants(e.perm) {
                    // The named or owning group grants it; the mask may still take it away.
                    return grants(e.perm & mask);
                }
            }
        }
        !found && self.perm_of(Tag::Other).is_some_and(grants)
    }
}

/// What a new node gets from its directory: its permission bits and ACLs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inherited {
    /// The node's mode (type bits kept).
    pub mode: u32,
    /// Its access ACL, when not expressible by the mode alone.
    pub access: Option<Acl>,
    /// Its default ACL (new directories only).
    pub default: Option<Acl>,
}

/// The kernel's `posix_acl_create`: a node of `mode` created in a directory with default ACL
/// `dir_default`. Without a default ACL the umask applies and there are no ACLs. With one,
/// the umask does not apply: the access ACL is the default ACL limited by the create mode
/// (`posix_acl_create_masq`), the mode follows that ACL, and a directory also inherits the
/// default ACL itself. Symlinks never carry ACLs.
pub fn inherit(dir_default: Option<&Acl>, mode: u32, umask: u32, is_dir: bool) -> Inherited {
    let is_symlink = mode & crate::attr::S_IFMT == crate::attr::FileType::Symlink.mode_bits();
    let Some(def) = dir_default.filter(|_| !is_symlink) else {
        let keep = if is_symlink { !0 } else { !(umask & 0o777) };
        return Inherited {
            mode: mode & keep,
            access: None,
            default: None,
        };
    };
    let mut access = def.clone();
    let mut perm = mode & 0o777;
    // Each base entry is cut to the create mode's class, and the class to the entry.
    for (tag, shift) in [(Tag::UserObj, 6), (Tag::Other, 0)] {
        let p = access.perm_of(tag).unwrap_or(0) & ((perm >> shift) & 7);
        access.set_perm(tag, p);
        perm = (perm & !(7 << shift)) | (p << shift);
    }
    let class = access.group_class();
    let p = access.perm_of(class).unwrap_or(0) & ((perm >> 3) & 7);
    access.set_perm(class, p);
    perm = (perm & !0o070) | (p << 3);
    let mode = (mode & !0o777) | perm;
    // A mask alone is kept (the kernel's create_masq counts it as "not equivalent").
    let mode_only = access.is_mode_only() && !access.has_mask();
    Inherited {
        mode,
        access: (!mode_only).then_some(access),
        default: is_dir.then(|| def.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: Tag, perm: u32) -> Entry {
        Entry { tag, perm }
    }

    fn acl(entries: &[Entry]) -> Acl {
        Acl::new(entries.to_vec()).expect("valid")
    }

    #[test]
    fn round_trips_and_rejects_malformed_values() {
        let a = acl(&[
            e(Tag::UserObj, 6),
            e(Tag::User(65534), 0),
            e(Tag::GroupObj, 4),
            e(Tag::Mask, 4),
            e(Tag::Other, 4),
        ]);
        let v = a.encode();
        assert_eq!(v.len(), 4 + 5 * 8);
        assert_eq!(Acl::decode(&v).expect("decode"), Some(a));
        assert_eq!(Acl::decode(&2u32.to_le_bytes()).expect("empty"), None);
        for bad in [
            &[][..],
            &[2, 0, 0][..],
            &[1, 0, 0, 0][..],                           // version 1
            &v[..v.len() - 1],                           // torn entry
            &[&v[..4], &v[12..]].concat()[..],           // no USER_OBJ
            &[&v[..4], &v[4..12], &v[4..]].concat()[..], // USER_OBJ twice
        ] {
            assert_eq!(err(Acl::decode(bad)), libc_einval(), "{bad:?}");
        }
        // Named entry without a mask; perm beyond rwx; unknown tag.
        assert!(Acl::new(vec![
            e(Tag::UserObj, 6),
            e(Tag::User(1), 4),
            e(Tag::GroupObj, 4),
            e(Tag::Other, 4)
        ])
        .is_err());
        assert!(Acl::new(vec![
            e(Tag::UserObj, 8),
            e(Tag::GroupObj, 4),
            e(Tag::Other, 4)
        ])
        .is_err());
        let mut unknown = v.clone();
        unknown[4] = 0x40;
        assert!(Acl::decode(&unknown).is_err());
    }

    fn err<T: std::fmt::Debug>(r: FsResult<T>) -> i32 {
        r.expect_err("error").errno()
    }

    fn libc_einval() -> i32 {
        FsError::Invalid.errno()
    }

    #[test]
    fn mode_and_chmod_use_the_mask_as_the_group_class() {
        let mut a = acl(&[
            e(Tag::UserObj, 7),
            e(Tag::User(5), 7),
            e(Tag::GroupObj, 5),
            e(Tag::Mask, 5),
            e(Tag::Other, 1),
        ]);
        assert_eq!(a.mode_bits(), 0o751);
        a.chmod(0o600);
        assert_eq!(a.mode_bits(), 0o600);
        assert_eq!(a.perm_of(Tag::Mask), Some(0));
        assert_eq!(
            a.perm_of(Tag::GroupObj),
            Some(5),
            "the group entry keeps its bits"
        );
        assert_eq!(a.perm_of(Tag::User(5)), Some(7));
        assert!(!a.is_mode_only());
        let base = acl(&[e(Tag::UserObj, 6), e(Tag::GroupObj, 4), e(Tag::Other, 4)]);
        assert!(base.is_mode_only());
        assert_eq!(base.mode_bits(), 0o644);
    }

    #[test]
    fn permission_follows_the_posix_algorithm() {
        let a = acl(&[
            e(Tag::UserObj, 6),
            e(Tag::User(7), 0),
            e(Tag::User(8), 6),
            e(Tag::GroupObj, 4),
            e(Tag::Group(50), 6),
            e(Tag::Mask, 4),
            e(Tag::Other, 4),
        ]);
        let (uid, gid) = (1, 10);
        let user = |u| Cred::user(u, 99);
        assert!(a.permits(uid, gid, &user(1), MAY_WRITE), "owner: USER_OBJ");
        assert!(
            !a.permits(uid, gid, &user(7), MAY_READ),
            "named user with ---"
        );
        assert!(a.permits(uid, gid, &user(8), MAY_READ));
        assert!(
            !a.permits(uid, gid, &user(8), MAY_WRITE),
            "mask caps a named user"
        );
        assert!(
            a.permits(uid, gid, &Cred::user(3, 10), MAY_READ),
            "owning group"
        );
        assert!(
            !a.permits(uid, gid, &Cred::user(3, 50), MAY_WRITE),
            "mask caps a group"
        );
        assert!(a.permits(uid, gid, &user(3), MAY_READ), "other");
        // A matching group that does not grant denies, even where other would grant.
        let g = acl(&[
            e(Tag::UserObj, 6),
            e(Tag::GroupObj, 0),
            e(Tag::Mask, 7),
            e(Tag::Other, 4),
        ]);
        assert!(!g.permits(uid, gid, &Cred::user(3, 10), MAY_READ));
    }

    #[test]
    fn creation_masks_the_default_acl_by_the_create_mode_without_umask() {
        let def = acl(&[
            e(Tag::UserObj, 7),
            e(Tag::User(5), 7),
            e(Tag::GroupObj, 5),
            e(Tag::Mask, 7),
            e(Tag::Other, 5),
        ]);
        let file = inherit(Some(&def), 0o100666, 0o077, false);
        assert_eq!(file.mode, 0o100666 & 0o100664);
        let access = file.access.expect("access ACL");
        assert_eq!(access.perm_of(Tag::Mask), Some(6));
        assert_eq!(access.perm_of(Tag::Other), Some(4));
        assert_eq!(file.default, None);
        let dir = inherit(Some(&def), 0o040777, 0o077, true);
        assert_eq!(dir.mode, 0o040775);
        assert_eq!(dir.default.as_ref(), Some(&def));
        // Without a default ACL the umask applies; a base-only default gives no access ACL.
        let plain = inherit(None, 0o100666, 0o022, false);
        assert_eq!((plain.mode, plain.access), (0o100644, None));
        let base = acl(&[e(Tag::UserObj, 7), e(Tag::GroupObj, 7), e(Tag::Other, 0)]);
        let f = inherit(Some(&base), 0o100666, 0o022, false);
        assert_eq!((f.mode, f.access), (0o100660, None));
        // Symlinks: neither.
        let l = inherit(Some(&def), 0o120777, 0o022, false);
        assert_eq!((l.mode, l.access), (0o120777, None));
    }
}
