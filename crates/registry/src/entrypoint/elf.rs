//! What a file's first bytes say about how the kernel runs it: an ELF header's machine, or a
//! `#!` line's interpreter.
//!
//! The header is read by hand: the fields needed (`e_ident`'s magic, class and data encoding,
//! `e_type` and `e_machine`) sit at the same offsets in 32- and 64-bit files, within the first
//! 20 bytes (System V gABI, "ELF Header").

/// Bytes of a file kept to classify it: the kernel reads this much of a script for its `#!`
/// line (`BINPRM_BUF_SIZE` since Linux 5.1), and an ELF header needs 20 of them.
pub(crate) const HEAD_BYTES: usize = 256;

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const ELFCLASS32: u8 = 1;
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const ELFDATA2MSB: u8 = 2;
const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;

/// What a file's head says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Head {
    /// An ELF executable or shared object for this Go/OCI architecture.
    Elf(&'static str),
    /// An ELF file the kernel would not execute, or whose machine has no Go/OCI name here.
    ElfUnusable(String),
    /// A script: the interpreter its `#!` line names.
    Script(String),
    /// Neither ELF nor `#!`.
    Unknown,
}

pub(crate) fn classify(head: &[u8]) -> Head {
    if head.starts_with(ELF_MAGIC) {
        return match elf_arch(head) {
            Ok(arch) => Head::Elf(arch),
            Err(why) => Head::ElfUnusable(why),
        };
    }
    if let Some(line) = head.strip_prefix(b"#!") {
        return match interpreter(line) {
            Some(i) => Head::Script(i),
            None => Head::Unknown,
        };
    }
    Head::Unknown
}

/// The interpreter of a `#!` line (the bytes after `#!`): leading blanks skipped, then up to
/// the next blank, NUL or newline, as the kernel's `binfmt_script` reads it.
fn interpreter(line: &[u8]) -> Option<String> {
    let line = line.split(|b| *b == b'\n').next().unwrap_or_default();
    let start = line.iter().position(|b| *b != b' ' && *b != b'\t')?;
    let rest = line.get(start..)?;
    let end = rest.iter().position(|b| matches!(b, b' ' | b'\t' | b'\0' | b'\r')).unwrap_or(rest.len());
    let name = std::str::from_utf8(rest.get(..end)?).ok()?;
    (!name.is_empty()).then(|| name.to_string())
}

/// The Go/OCI architecture an ELF file runs on, from its identification bytes and `e_machine`.
pub(crate) fn elf_arch(head: &[u8]) -> Result<&'static str, String> {
    let Some(ident) = head.get(..20) else {
        return Err(format!("ELF header cut short at {} bytes", head.len()));
    };
    let (class, data) = (ident.get(4).copied().unwrap_or(0), ident.get(5).copied().unwrap_or(0));
    let half = |at: usize| -> Option<u16> {
        let b = [*ident.get(at)?, *ident.get(at + 1)?];
        match data {
            ELFDATA2LSB => Some(u16::from_le_bytes(b)),
            ELFDATA2MSB => Some(u16::from_be_bytes(b)),
            _ => None,
        }
    };
    if class != ELFCLASS32 && class != ELFCLASS64 {
        return Err(format!("ELF class {class} is neither 32- nor 64-bit"));
    }
    let (Some(e_type), Some(e_machine)) = (half(16), half(18)) else {
        return Err(format!("ELF data encoding {data} is neither little- nor big-endian"));
    };
    if e_type != ET_EXEC && e_type != ET_DYN {
        return Err(format!("ELF type {e_type} is not an executable"));
    }
    machine_arch(e_machine, class == ELFCLASS64, data == ELFDATA2LSB).ok_or_else(|| format!("ELF machine {e_machine} has no Go architecture name here"))
}

/// `e_machine` (gABI's EM_* values) to GOARCH, the names OCI platforms use. The class and byte
/// order pick among the names one machine value covers (EM_PPC64 is ppc64 or ppc64le, EM_MIPS
/// is 32 or 64-bit, either order). x86-64's x32 and AArch64's ILP32 ABIs still need that CPU,
/// so they name it.
fn machine_arch(e_machine: u16, is64: bool, little: bool) -> Option<&'static str> {
    Some(match (e_machine, is64, little) {
        (3, false, true) => "386",                        // EM_386
        (62, _, true) => "amd64",                         // EM_X86_64
        (183, _, true) => "arm64",                        // EM_AARCH64
        (183, _, false) => "arm64be",
        (40, false, true) => "arm",                       // EM_ARM
        (40, false, false) => "armbe",
        (21, true, true) => "ppc64le",                    // EM_PPC64
        (21, true, false) => "ppc64",
        (20, false, false) => "ppc",                      // EM_PPC
        (22, true, false) => "s390x",                     // EM_S390
        (22, false, false) => "s390",
        (243, true, true) => "riscv64",                   // EM_RISCV
        (243, false, true) => "riscv",
        (8, false, false) => "mips",                      // EM_MIPS
        (8, false, true) => "mipsle",
        (8, true, false) => "mips64",
        (8, true, true) => "mips64le",
        (258, true, true) => "loong64",                   // EM_LOONGARCH
        (2, false, false) => "sparc",                     // EM_SPARC
        (43, true, false) => "sparc64",                   // EM_SPARCV9
        _ => return None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A 64-byte ELF header (the rest zero): class, data, e_type and e_machine as given.
    pub(crate) fn elf_header(class: u8, data: u8, e_type: u16, e_machine: u16) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(ELF_MAGIC);
        h[4] = class;
        h[5] = data;
        h[6] = 1;
        let (t, m) = if data == ELFDATA2MSB { (e_type.to_be_bytes(), e_machine.to_be_bytes()) } else { (e_type.to_le_bytes(), e_machine.to_le_bytes()) };
        h[16..18].copy_from_slice(&t);
        h[18..20].copy_from_slice(&m);
        h
    }

    #[test]
    fn machines_map_to_go_architectures() {
        let cases = [
            (ELFCLASS64, ELFDATA2LSB, 62, "amd64"),
            (ELFCLASS64, ELFDATA2LSB, 183, "arm64"),
            (ELFCLASS32, ELFDATA2LSB, 3, "386"),
            (ELFCLASS32, ELFDATA2LSB, 40, "arm"),
            (ELFCLASS64, ELFDATA2LSB, 21, "ppc64le"),
            (ELFCLASS64, ELFDATA2MSB, 21, "ppc64"),
            (ELFCLASS64, ELFDATA2MSB, 22, "s390x"),
            (ELFCLASS64, ELFDATA2LSB, 243, "riscv64"),
            (ELFCLASS32, ELFDATA2MSB, 8, "mips"),
            (ELFCLASS64, ELFDATA2LSB, 8, "mips64le"),
            (ELFCLASS64, ELFDATA2LSB, 258, "loong64"),
        ];
        for (class, data, machine, want) in cases {
            assert_eq!(classify(&elf_header(class, data, ET_DYN, machine)), Head::Elf(want), "e_machine {machine}");
            assert_eq!(classify(&elf_header(class, data, ET_EXEC, machine)), Head::Elf(want), "e_machine {machine}");
        }
    }

    #[test]
    fn unusable_elf_headers_say_why() {
        for (head, why) in [
            (elf_header(ELFCLASS64, ELFDATA2LSB, 1, 62), "not an executable"),
            (elf_header(ELFCLASS64, ELFDATA2LSB, ET_EXEC, 50), "no Go architecture"),
            (elf_header(3, ELFDATA2LSB, ET_EXEC, 62), "neither 32- nor 64-bit"),
            (elf_header(ELFCLASS64, 7, ET_EXEC, 62), "neither little- nor big-endian"),
            (elf_header(ELFCLASS64, ELFDATA2LSB, ET_EXEC, 62)[..19].to_vec(), "cut short"),
        ] {
            match classify(&head) {
                Head::ElfUnusable(msg) => assert!(msg.contains(why), "{msg:?} should say {why:?}"),
                other => panic!("expected an unusable ELF, got {other:?}"),
            }
        }
    }

    #[test]
    fn shebang_lines_name_their_interpreter() {
        assert_eq!(classify(b"#!/bin/sh\necho hi\n"), Head::Script("/bin/sh".into()));
        assert_eq!(classify(b"#! /usr/bin/env python3 -u\n"), Head::Script("/usr/bin/env".into()));
        assert_eq!(classify(b"#!\t/bin/bash\r\n"), Head::Script("/bin/bash".into()));
        assert_eq!(classify(b"#!/bin/sh"), Head::Script("/bin/sh".into()), "no newline within the head");
        assert_eq!(classify(b"#!\n"), Head::Unknown, "an empty #! line names nothing");
        assert_eq!(classify(b"echo hi\n"), Head::Unknown);
        assert_eq!(classify(b""), Head::Unknown);
        assert_eq!(classify(b"\x7fEL"), Head::Unknown, "a cut magic is not ELF");
    }
}
