//! The import slots of a shared library loaded in this process: the words of its global
//! offset table through which it calls functions of other libraries (`R_*_JUMP_SLOT` and
//! `R_*_GLOB_DAT` relocations). Swapping a slot redirects that one library's calls to one
//! function, and nothing else in the process; swapping it back undoes it.
//!
//! ump-alloc supplies PyTorch's segments this way: `libc10_cuda.so` (PyTorch's caching
//! allocator) calls `cudaMalloc`/`cudaFree` of `libcudart` for every segment it maps and
//! releases, so its two slots are pointed at ump-alloc's functions (`crate::ffi::torch`).
//! Everything is read from the loaded image (the dynamic section, the symbol and string
//! tables, the relocation tables), found with `dl_iterate_phdr`; nothing depends on a C++
//! ABI. Slots inside the RELRO segment are made writable for the one store and read-only
//! again.

use crate::error::{Error, Result};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `Elf64_Dyn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Dyn {
    tag: i64,
    val: u64,
}

/// `Elf64_Rela`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Rela {
    offset: u64,
    info: u64,
    addend: i64,
}

/// `Elf64_Sym`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

const DT_NULL: i64 = 0;
const DT_NEEDED: i64 = 1;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_STRSZ: i64 = 10;
const DT_PLTREL: i64 = 20;
const DT_JMPREL: i64 = 23;

#[cfg(target_arch = "x86_64")]
const R_GLOB_DAT: u32 = 6;
#[cfg(target_arch = "x86_64")]
const R_JUMP_SLOT: u32 = 7;
#[cfg(target_arch = "aarch64")]
const R_GLOB_DAT: u32 = 1025;
#[cfg(target_arch = "aarch64")]
const R_JUMP_SLOT: u32 = 1026;

/// One import slot: the word at `addr` holds the address the library calls for `symbol`.
#[derive(Clone, Debug)]
pub struct Slot {
    pub symbol: String,
    pub addr: usize,
}

impl Slot {
    /// The address the slot holds now.
    pub fn get(&self) -> usize {
        // SAFETY: `addr` is a pointer-aligned word of a loaded library's offset table,
        // readable for the life of the process (the library is never unloaded: callers keep
        // a handle to it).
        unsafe { &*(self.addr as *const AtomicUsize) }.load(Ordering::Acquire)
    }
}

/// What was found of a loaded library.
#[derive(Debug)]
pub struct Imports {
    /// The path the library was loaded from.
    pub path: String,
    /// Every slot of the symbols asked for (a symbol may have a JUMP_SLOT and a GLOB_DAT).
    pub slots: Vec<Slot>,
    /// Its DT_NEEDED entries (the libraries it links against).
    pub needed: Vec<String>,
}

struct Search<'a> {
    want: &'a str,
    symbols: &'a [&'a str],
    found: Option<Result<Imports>>,
}

/// Find the loaded library whose path is `path` (compared after resolving links) or whose
/// file name is `path`'s, and the import slots of `symbols` in it.
pub fn imports(path: &str, symbols: &[&str]) -> Result<Imports> {
    let want = std::fs::canonicalize(path)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| path.to_string());
    let mut s = Search {
        want: &want,
        symbols,
        found: None,
    };
    // SAFETY: the callback only reads the loader's records for the duration of the call and
    // gets `s` back through `data`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut s as *mut Search).cast()) };
    s.found.unwrap_or_else(|| {
        Err(Error::unsupported(format!(
            "{path} is not loaded in this process"
        )))
    })
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: `data` is the `Search` passed to dl_iterate_phdr; `info` is the loader's
    // record, valid during the callback.
    let (s, info) = unsafe { (&mut *(data as *mut Search), &*info) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: a NUL-terminated path owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
    if name.is_empty() {
        return 0;
    }
    let same = std::fs::canonicalize(&*name)
        .map(|p| p.to_string_lossy() == s.want)
        .unwrap_or(false);
    if !same {
        return 0;
    }
    s.found = Some(read_imports(info, &name, s.symbols));
    1
}

/// A dynamic-section pointer: the loader has added the load bias to most of them in place
/// (glibc on x86-64 and aarch64); a value below the bias was left as a file address.
fn fix(val: u64, bias: usize) -> usize {
    let v = val as usize;
    if v < bias { bias + v } else { v }
}

fn read_imports(info: &libc::dl_phdr_info, name: &str, symbols: &[&str]) -> Result<Imports> {
    let bias = info.dlpi_addr as usize;
    // SAFETY: the loader's program headers of this object: `dlpi_phnum` entries.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let dynamic = phdrs
        .iter()
        .find(|p| p.p_type == libc::PT_DYNAMIC)
        .ok_or_else(|| Error::unsupported(format!("{name} has no dynamic section")))?;
    let (mut strtab, mut strsz, mut symtab) = (0usize, 0usize, 0usize);
    let (mut rela, mut relasz, mut jmprel, mut pltrelsz, mut pltrel) = (0, 0, 0, 0, DT_RELA);
    let mut needed_offsets = Vec::new();
    let mut d = (bias + dynamic.p_vaddr as usize) as *const Dyn;
    loop {
        // SAFETY: the dynamic section is an array of entries ended by DT_NULL.
        let e = unsafe { *d };
        match e.tag {
            DT_NULL => break,
            DT_NEEDED => needed_offsets.push(e.val as usize),
            DT_STRTAB => strtab = fix(e.val, bias),
            DT_STRSZ => strsz = e.val as usize,
            DT_SYMTAB => symtab = fix(e.val, bias),
            DT_RELA => rela = fix(e.val, bias),
            DT_RELASZ => relasz = e.val as usize,
            DT_JMPREL => jmprel = fix(e.val, bias),
            DT_PLTRELSZ => pltrelsz = e.val as usize,
            DT_PLTREL => pltrel = e.val as i64,
            _ => {}
        }
        // SAFETY: still inside the array (the DT_NULL entry ends it).
        d = unsafe { d.add(1) };
    }
    if strtab == 0 || symtab == 0 || pltrel != DT_RELA {
        return Err(Error::unsupported(format!(
            "{name}: no symbol table or no RELA relocations"
        )));
    }
    let string = |off: usize| -> Option<String> {
        if off >= strsz {
            return None;
        }
        // SAFETY: inside the string table, whose strings are NUL-terminated.
        let s = unsafe { CStr::from_ptr((strtab + off) as *const c_char) };
        Some(s.to_string_lossy().into_owned())
    };
    let needed = needed_offsets.into_iter().filter_map(string).collect();
    let mut slots = Vec::new();
    for (table, size) in [(jmprel, pltrelsz), (rela, relasz)] {
        if table == 0 {
            continue;
        }
        let n = size / size_of::<Rela>();
        // SAFETY: a relocation table of the loaded image, `size` bytes long.
        let relas = unsafe { std::slice::from_raw_parts(table as *const Rela, n) };
        for r in relas {
            let (kind, index) = ((r.info & 0xffff_ffff) as u32, (r.info >> 32) as usize);
            if index == 0 || (kind != R_JUMP_SLOT && kind != R_GLOB_DAT) {
                continue;
            }
            // SAFETY: a relocation's symbol index lies in the dynamic symbol table.
            let sym = unsafe { *(symtab as *const Sym).add(index) };
            let Some(sname) = string(sym.name as usize) else {
                continue;
            };
            if !symbols.contains(&sname.as_str()) {
                continue;
            }
            slots.push(Slot {
                symbol: sname,
                addr: bias + r.offset as usize,
            });
        }
    }
    Ok(Imports {
        path: name.to_string(),
        slots,
        needed,
    })
}

/// Store `value` in `slot` and return what it held. A page that is not writable now (RELRO
/// after the loader protected it, as full-RELRO programs have it) is made writable for the
/// store and given back exactly the protection it had.
///
/// # Safety
/// `value` is a function with the signature the library expects for `slot.symbol` that stays
/// valid as long as the slot holds it; the library's code may call it from any thread as
/// soon as the store is done.
pub unsafe fn swap(slot: &Slot, value: usize) -> Result<usize> {
    let page = crate::prim::os::page_size();
    let start = (slot.addr & !(page - 1)) as *mut c_void;
    let prot = page_protection(start as usize).ok_or_else(|| {
        Error::unsupported(format!(
            "the import slot of {} lies in no mapping of this process",
            slot.symbol
        ))
    })?;
    let writable = prot & libc::PROT_WRITE != 0;
    if !writable {
        // SAFETY: a page of the library's own offset table; making it writable changes no
        // contents.
        if unsafe { libc::mprotect(start, page, prot | libc::PROT_WRITE) } != 0 {
            return Err(Error::unsupported(format!(
                "cannot make the import slot of {} writable: {}",
                slot.symbol,
                std::io::Error::last_os_error()
            )));
        }
    }
    // SAFETY: an aligned word of the offset table, writable now; callers read it with one
    // load, so the swap is atomic for them.
    let old = unsafe { &*(slot.addr as *const AtomicUsize) }.swap(value, Ordering::AcqRel);
    if !writable {
        // SAFETY: back to the protection the page had.
        unsafe { libc::mprotect(start, page, prot) };
    }
    Ok(old)
}

/// The protection (`PROT_*` bits) of the mapping holding `addr`, from `/proc/self/maps`.
pub fn page_protection(addr: usize) -> Option<libc::c_int> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let (lo, hi) = it.next()?.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        if !(lo..hi).contains(&addr) {
            return None;
        }
        let perms = it.next()?.as_bytes();
        let bit = |i: usize, c: u8, p: libc::c_int| if perms.get(i) == Some(&c) { p } else { 0 };
        Some(
            bit(0, b'r', libc::PROT_READ)
                | bit(1, b'w', libc::PROT_WRITE)
                | bit(2, b'x', libc::PROT_EXEC),
        )
    })
}

/// Keep the loaded library `path` (as [`Imports::path`] names it) loaded for the life of the
/// process, whatever `dlclose` calls follow (`RTLD_NODELETE`): slots swapped in it must not
/// vanish under the swapper. Nothing is loaded that was not. False when it is not loaded.
pub fn keep_loaded(path: &str) -> bool {
    let Ok(c) = CString::new(path) else {
        return false;
    };
    // SAFETY: RTLD_NOLOAD finds the library only if it is loaded: nothing is mapped and no
    // initialiser runs; RTLD_NODELETE marks it never to be unloaded. The handle is kept.
    let h = unsafe {
        libc::dlopen(
            c.as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_NODELETE | libc::RTLD_LAZY,
        )
    };
    !h.is_null()
}

/// The path of the loaded object that holds code address `addr` (`dladdr`), if any.
pub fn object_of(addr: usize) -> Option<String> {
    // SAFETY: all-zero is a valid `Dl_info`; dladdr fills it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's records; `info` is a valid out-pointer.
    if addr == 0 || unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 {
        return None;
    }
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated path owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    Some(
        std::fs::canonicalize(&*name)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| name.into_owned()),
    )
}

/// `symbol` as the process's global scope resolves it (`RTLD_DEFAULT`: the program, then
/// `LD_PRELOAD`ed libraries, then those loaded globally), if any.
pub fn resolve_global(symbol: &str) -> Option<usize> {
    let sym = CString::new(symbol).ok()?;
    // SAFETY: a lookup in the global scope; the address is only stored.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, sym.as_ptr()) } as usize;
    (p != 0).then_some(p)
}

/// `symbol` as exported by the already loaded library `needed` (a DT_NEEDED name such as
/// `libcudart.so.13`), or None. The library is looked up without loading it and stays
/// referenced for the life of the process (a slot may point into it).
pub fn resolve(needed: &str, symbol: &str) -> Option<usize> {
    let lib = CString::new(needed).ok()?;
    let sym = CString::new(symbol).ok()?;
    // SAFETY: RTLD_NOLOAD finds a library only if it is loaded already: nothing is mapped
    // and no initialiser runs. The handle is kept (never dlclose'd).
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if h.is_null() {
        return None;
    }
    // SAFETY: a symbol lookup in a live handle; the address is only stored.
    let p = unsafe { libc::dlsym(h, sym.as_ptr()) } as usize;
    (p != 0).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libm's imports from libc: a lazily bound JUMP_SLOT outside RELRO and a GLOB_DAT inside
    /// it, both found, swapped (RELRO made writable and read-only again) and put back.
    #[test]
    fn finds_and_swaps_slots_of_a_loaded_library() {
        let libm = CString::new("libm.so.6").unwrap();
        // SAFETY: loading the system math library runs only its own initialisers.
        let h = unsafe { libc::dlopen(libm.as_ptr(), libc::RTLD_NOW) };
        assert!(!h.is_null());
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let path = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("libm.so"))
            .expect("libm mapped")
            .to_string();
        let imp = imports(
            &path,
            &["__cxa_finalize", "__strtold_nan", "no_such_symbol"],
        )
        .unwrap();
        assert!(
            imp.needed.iter().any(|n| n.starts_with("libc.so")),
            "{imp:?}"
        );
        let fin = imp.slots.iter().find(|s| s.symbol == "__cxa_finalize");
        let nan = imp.slots.iter().find(|s| s.symbol == "__strtold_nan");
        let (fin, nan) = (fin.expect("GLOB_DAT slot"), nan.expect("JUMP_SLOT slot"));
        let prot = |s: &Slot| page_protection(s.addr).unwrap();
        let (fin_prot, nan_prot) = (prot(fin), prot(nan));
        assert_eq!(
            fin_prot & libc::PROT_WRITE,
            0,
            "a GLOB_DAT slot lies in RELRO, read-only: {fin:?}"
        );
        assert_ne!(
            nan_prot & libc::PROT_WRITE,
            0,
            "a lazy JUMP_SLOT lies in the writable .got.plt: {nan:?}"
        );
        assert_eq!(
            fin.get(),
            resolve("libc.so.6", "__cxa_finalize").unwrap(),
            "a bound slot holds the function the loader resolved"
        );
        for slot in [fin, nan] {
            let before = slot.get();
            // SAFETY: the value it held is stored back: libm's behaviour is unchanged.
            assert_eq!(unsafe { swap(slot, before) }.unwrap(), before);
            assert_eq!(slot.get(), before);
        }
        // Each page has exactly the protection it had: the RELRO page read-only again.
        assert_eq!((prot(fin), prot(nan)), (fin_prot, nan_prot));
        assert!(imports("/no/such/library.so", &["free"]).is_err());
        // The text of libm is libm's, and libm stays loaded once kept.
        let cos = resolve("libm.so.6", "cos").unwrap();
        assert_eq!(
            object_of(cos).as_deref(),
            std::fs::canonicalize(&path)
                .ok()
                .as_ref()
                .and_then(|p| p.to_str())
        );
        assert!(keep_loaded(&path));
        assert!(!keep_loaded("/no/such/library.so"));
    }
}
