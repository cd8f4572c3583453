//! Decoding of parsed entry bodies into the IR: memory layout of shared/local variables,
//! dense register allocation, label resolution, and per-instruction decoding (`decode_ops`).

use std::collections::HashMap;

use crate::cfg;
use crate::error::{Pos, PtxError};
use crate::ir::{Entry, Inst, Op, PSrc, Space, Src, Sreg, Ty};
use crate::load::{Meter, elems, map_entry, str_bytes};
use crate::module::{EntryInfo, ParamInfo};

/// Most distinct registers (values + predicates) an entry may use.
const MAX_REGS: usize = 1 << 16;
/// Most instructions per entry.
const MAX_INSTS: usize = 1 << 20;
/// Largest shared/local total (bytes).
const MAX_MEM: u64 = 1 << 30;

/// A `.shared` or `.local` variable.
#[derive(Debug, Clone)]
pub(crate) struct VarDecl {
    pub name: String,
    pub size: u64,
    pub align: u32,
    pub is_extern: bool,
    pub pos: Pos,
}

/// Declarations of one entry collected by the parser.
#[derive(Debug)]
pub(crate) struct EntryDecls {
    pub name: String,
    pub params: Vec<ParamInfo>,
    pub param_size: u32,
    pub reqntid: Option<[u32; 3]>,
    pub maxntid: Option<[u32; 3]>,
    pub shared: Vec<VarDecl>,
    pub local: Vec<VarDecl>,
    /// Call-site `.param` variables (argument/return buffers of inlined calls), per thread.
    pub call_params: Vec<VarDecl>,
    /// Index of `call_params` by name.
    pub call_param_index: HashMap<String, usize>,
    pub regs: HashMap<String, Ty>,
    pub pos: Pos,
    /// Host bytes charged to the load for these declarations and their body (freed when they
    /// are dropped).
    pub bytes: u64,
}

/// A raw operand.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ROp {
    Name(String, Pos),
    Not(String, Pos),
    Int(u64),
    F32(u32),
    F64(u64),
    Addr {
        base: Option<String>,
        off: i64,
        pos: Pos,
    },
    SymOff(String, i64, Pos),
    Vec(Vec<ROp>),
    /// Parenthesized list (call arguments / return values).
    List(Vec<ROp>),
    Pair(String, String, Pos),
}

/// A raw instruction.
#[derive(Debug, Clone)]
pub(crate) struct RawInst {
    pub pos: Pos,
    pub guard: Option<(String, bool, Pos)>,
    pub opcode: String,
    pub ops: Vec<ROp>,
}

/// A body statement.
#[derive(Debug, Clone)]
pub(crate) enum Stmt {
    Label(String, Pos),
    Inst(RawInst),
}

type R<T> = Result<T, PtxError>;

/// Name resolution while decoding one entry.
pub(crate) struct Ctx<'a> {
    pub decls: &'a EntryDecls,
    regs: HashMap<String, u32>,
    preds: HashMap<String, u32>,
    /// Symbols usable as addresses: (space, address in that space).
    syms: HashMap<String, (Space, u64)>,
    /// Module-level symbols (looked up after the entry's own).
    module: &'a ModuleSyms,
    pub labels: HashMap<String, u32>,
    /// Current instruction (for errors).
    pub pos: Pos,
    pub opcode: String,
}

impl Ctx<'_> {
    pub(crate) fn operr<T>(&self, msg: impl Into<String>) -> R<T> {
        Err(PtxError::Operand {
            pos: self.pos,
            inst: self.opcode.clone(),
            msg: msg.into(),
        })
    }

    pub(crate) fn unsupported<T>(&self) -> R<T> {
        Err(PtxError::UnsupportedInstruction {
            pos: self.pos,
            name: self.opcode.chars().take(80).collect(),
        })
    }

    fn undefined<T>(&self, name: &str, pos: Pos) -> R<T> {
        Err(PtxError::Undefined {
            pos,
            name: name.chars().take(80).collect(),
        })
    }

    /// A symbol of the entry or the module: (space, address).
    pub(crate) fn sym(&self, n: &str) -> Option<(Space, u64)> {
        self.syms.get(n).or_else(|| self.module.map.get(n)).copied()
    }

    /// Declared type of a value register.
    pub(crate) fn reg_ty(&self, name: &str) -> Option<Ty> {
        self.decls.regs.get(name).copied()
    }

    /// Dense index of a non-predicate register.
    pub(crate) fn reg(&mut self, name: &str, pos: Pos) -> R<u32> {
        match self.reg_ty(name) {
            Some(Ty::Pred) => return self.operr(format!("`{name}` is a predicate")),
            Some(_) => {}
            None => return self.undefined(name, pos),
        }
        if let Some(i) = self.regs.get(name) {
            return Ok(*i);
        }
        if self.regs.len() + self.preds.len() >= MAX_REGS {
            return Err(PtxError::TooLarge {
                pos,
                what: "register count".into(),
            });
        }
        let i = self.regs.len() as u32;
        self.regs.insert(name.to_string(), i);
        Ok(i)
    }

    /// Index of the hidden predicate that holds the carry flag CC.CF (allocated on first use;
    /// its name cannot be written in PTX).
    pub(crate) fn carry_flag(&mut self) -> R<u32> {
        const NAME: &str = "CC.CF#";
        if let Some(i) = self.preds.get(NAME) {
            return Ok(*i);
        }
        if self.regs.len() + self.preds.len() >= MAX_REGS {
            return Err(PtxError::TooLarge {
                pos: self.pos,
                what: "register count".into(),
            });
        }
        let i = self.preds.len() as u32;
        self.preds.insert(NAME.to_string(), i);
        Ok(i)
    }

    /// Dense index of a predicate register.
    pub(crate) fn pred(&mut self, name: &str, pos: Pos) -> R<u32> {
        match self.reg_ty(name) {
            Some(Ty::Pred) => {}
            Some(_) => return self.operr(format!("`{name}` is not a predicate")),
            None => return self.undefined(name, pos),
        }
        if let Some(i) = self.preds.get(name) {
            return Ok(*i);
        }
        if self.regs.len() + self.preds.len() >= MAX_REGS {
            return Err(PtxError::TooLarge {
                pos,
                what: "register count".into(),
            });
        }
        let i = self.preds.len() as u32;
        self.preds.insert(name.to_string(), i);
        Ok(i)
    }

    /// A destination register operand.
    pub(crate) fn dst(&mut self, op: &ROp) -> R<u32> {
        match op {
            ROp::Name(n, pos) => self.reg(n, *pos),
            _ => self.operr("destination must be a register"),
        }
    }

    /// Declared width in bits of a destination register operand.
    pub(crate) fn dst_bits(&self, op: &ROp) -> u32 {
        match op {
            ROp::Name(n, _) => self.reg_ty(n).map_or(64, Ty::bits),
            _ => 64,
        }
    }

    /// A predicate destination.
    pub(crate) fn pdst(&mut self, op: &ROp) -> R<u32> {
        match op {
            ROp::Name(n, pos) => self.pred(n, *pos),
            _ => self.operr("destination must be a predicate"),
        }
    }

    /// A predicate source, possibly negated, or an integer constant.
    pub(crate) fn psrc(&mut self, op: &ROp) -> R<PSrc> {
        match op {
            ROp::Name(n, pos) => Ok(PSrc::Reg {
                idx: self.pred(n, *pos)?,
                neg: false,
            }),
            ROp::Not(n, pos) => Ok(PSrc::Reg {
                idx: self.pred(n, *pos)?,
                neg: true,
            }),
            ROp::Int(v) => Ok(PSrc::Const(*v != 0)),
            _ => self.operr("expected a predicate"),
        }
    }

    /// A value source converted to `ty`.
    pub(crate) fn src(&mut self, op: &ROp, ty: Ty) -> R<Src> {
        match op {
            ROp::Name(n, pos) => {
                if let Some(s) = sreg(n) {
                    return Ok(Src::Sreg(s));
                }
                if let Some((_, addr)) = self.sym(n) {
                    return Ok(Src::Imm(addr & ty.mask()));
                }
                Ok(Src::Reg(self.reg(n, *pos)?))
            }
            ROp::SymOff(n, off, pos) => match self.sym(n) {
                Some((_, addr)) => Ok(Src::Imm(addr.wrapping_add(*off as u64) & ty.mask())),
                None => self.undefined(n, *pos),
            },
            ROp::Int(v) => Ok(Src::Imm(match ty {
                Ty::F32 => u64::from((*v as i64 as f32).to_bits()),
                Ty::F64 => (*v as i64 as f64).to_bits(),
                _ => *v & ty.mask(),
            })),
            ROp::F32(b) => Ok(Src::Imm(match ty {
                Ty::F64 => f64::from(f32::from_bits(*b)).to_bits(),
                _ => u64::from(*b) & ty.mask(),
            })),
            ROp::F64(b) => Ok(Src::Imm(match ty {
                Ty::F32 => u64::from((f64::from_bits(*b) as f32).to_bits()),
                _ => *b & ty.mask(),
            })),
            _ => self.operr("expected a register or immediate"),
        }
    }

    /// An address operand `[base+off]`: base register or symbol, and the byte offset.
    /// Returns the space the symbol belongs to, if the base is a symbol.
    pub(crate) fn addr(&mut self, op: &ROp) -> R<(Src, i64, Option<Space>)> {
        match op {
            ROp::Addr {
                base: None, off, ..
            } => Ok((Src::Imm(0), *off, None)),
            ROp::Addr {
                base: Some(n),
                off,
                pos,
            } => {
                if let Some((sp, a)) = self.sym(n) {
                    return Ok((Src::Imm(a), *off, Some(sp)));
                }
                match self.reg_ty(n) {
                    Some(t) if t.bits() >= 32 && t != Ty::Pred => {}
                    Some(_) => return self.operr("address register must be 32 or 64 bits"),
                    None => return self.undefined(n, *pos),
                }
                Ok((Src::Reg(self.reg(n, *pos)?), *off, None))
            }
            _ => self.operr("expected an address `[...]`"),
        }
    }

    /// A branch target.
    pub(crate) fn label(&self, op: &ROp) -> R<u32> {
        match op {
            ROp::Name(n, pos) => match self.labels.get(n) {
                Some(t) => Ok(*t),
                None => self.undefined(n, *pos),
            },
            _ => self.operr("expected a label"),
        }
    }
}

/// Special register by name.
fn sreg(n: &str) -> Option<Sreg> {
    let dim = |s: &str| match s {
        "x" => Some(0u8),
        "y" => Some(1),
        "z" => Some(2),
        _ => None,
    };
    if let Some((head, d)) = n.split_once('.') {
        let d = dim(d)?;
        return Some(match head {
            "%tid" => Sreg::Tid(d),
            "%ntid" => Sreg::Ntid(d),
            "%ctaid" => Sreg::Ctaid(d),
            "%nctaid" => Sreg::Nctaid(d),
            _ => return None,
        });
    }
    Some(match n {
        "%laneid" => Sreg::LaneId,
        "%warpid" => Sreg::WarpId,
        "%nwarpid" => Sreg::NWarpId,
        "%clock" => Sreg::Clock,
        "%clock64" => Sreg::Clock64,
        "%globaltimer" => Sreg::GlobalTimer,
        "%lanemask_eq" => Sreg::LaneMaskEq,
        "%lanemask_lt" => Sreg::LaneMaskLt,
        "%lanemask_le" => Sreg::LaneMaskLe,
        "%lanemask_gt" => Sreg::LaneMaskGt,
        "%lanemask_ge" => Sreg::LaneMaskGe,
        "%smid" => Sreg::SmId,
        "%nsmid" => Sreg::NSmId,
        "%gridid" => Sreg::GridId,
        _ => return None,
    })
}

/// Module-level symbols shared by every entry: static `.shared` variables (offsets from 0),
/// `.global`/`.const` variables (module-window addresses), and `.extern .shared` declarations
/// (placed per entry after all static shared memory).
#[derive(Debug, Default)]
pub(crate) struct ModuleSyms {
    pub map: HashMap<String, (Space, u64)>,
    pub shared_end: u64,
    pub externs: Vec<VarDecl>,
}

/// Most module-level `.extern .shared` declarations.
const MAX_MODULE_EXTERNS: usize = 64;

impl ModuleSyms {
    /// Lay out module-level shared variables and add the module variables.
    pub(crate) fn build(shared: &[VarDecl], vars: &[crate::modvars::ModVar]) -> R<ModuleSyms> {
        let statics: Vec<VarDecl> = shared.iter().filter(|v| !v.is_extern).cloned().collect();
        let externs: Vec<VarDecl> = shared.iter().filter(|v| v.is_extern).cloned().collect();
        if let Some(v) = externs.get(MAX_MODULE_EXTERNS) {
            return Err(PtxError::TooLarge {
                pos: v.pos,
                what: "module-level .extern .shared declarations".into(),
            });
        }
        let mut map = HashMap::new();
        let (shared_end, _) = layout(&statics, Space::Shared, &mut map, 0, &[])?;
        for v in vars {
            let addr = crate::memory::MODULE_WINDOW + v.offset;
            if map.insert(v.name.clone(), (v.space, addr)).is_some() {
                return Err(PtxError::Duplicate {
                    pos: Pos::default(),
                    name: v.name.clone(),
                });
            }
        }
        Ok(ModuleSyms {
            map,
            shared_end,
            externs,
        })
    }
}

/// Lay out variables from offset `start`; `.extern` ones (and `more_externs`) share the
/// aligned end. Returns (end of static data, alignment of the extern area).
fn layout(
    vars: &[VarDecl],
    space: Space,
    syms: &mut HashMap<String, (Space, u64)>,
    start: u64,
    more_externs: &[VarDecl],
) -> R<(u64, u32)> {
    let mut off = start;
    let mut ext_align = 1u32;
    for v in vars.iter().filter(|v| !v.is_extern) {
        let a = u64::from(v.align.max(1));
        off = off.div_ceil(a) * a;
        if syms.insert(v.name.clone(), (space, off)).is_some() {
            return Err(PtxError::Duplicate {
                pos: v.pos,
                name: v.name.clone(),
            });
        }
        off = off.saturating_add(v.size);
        if off > MAX_MEM {
            return Err(PtxError::TooLarge {
                pos: v.pos,
                what: "shared/local memory".into(),
            });
        }
    }
    let externs = vars.iter().filter(|v| v.is_extern).chain(more_externs);
    for v in externs.clone() {
        ext_align = ext_align.max(v.align);
    }
    let a = u64::from(ext_align);
    let dyn_start = off.div_ceil(a) * a;
    for v in externs {
        syms.insert(v.name.clone(), (space, dyn_start));
    }
    Ok((off, ext_align))
}

/// Decode one entry.
pub(crate) fn decode_entry(
    mut decls: EntryDecls,
    body: Vec<Stmt>,
    funcs: &HashMap<String, crate::inline::FuncDef>,
    module: &ModuleSyms,
    meter: &mut Meter,
) -> R<Entry> {
    let body = crate::inline::expand_calls(&mut decls, body, funcs, meter)?;
    // The implicit exit at the end of the code counts like any instruction.
    meter.instructions(1)?;
    // Transient tables of this decode (symbols, labels, dense register maps, CFG analysis),
    // charged as they grow and freed at the end.
    let mut transient = 0u64;
    let r = decode_body(&decls, &body, module, meter, &mut transient);
    meter.free(transient);
    meter.free(decls.bytes);
    r
}

fn decode_body(
    decls: &EntryDecls,
    body: &[Stmt],
    module: &ModuleSyms,
    meter: &mut Meter,
    transient: &mut u64,
) -> R<Entry> {
    let mut charge = |meter: &mut Meter, b: u64| -> R<()> {
        meter.alloc(b)?;
        *transient += b;
        Ok(())
    };
    let sym_bytes = |n: &str| map_entry::<String, (Space, u64)>() + str_bytes(n);
    let syms_bytes: u64 = decls.params.iter().map(|p| sym_bytes(&p.name)).sum::<u64>()
        + decls.shared.iter().map(|v| sym_bytes(&v.name)).sum::<u64>()
        + decls.local.iter().map(|v| sym_bytes(&v.name)).sum::<u64>()
        + decls
            .call_params
            .iter()
            .map(|v| sym_bytes(&v.name))
            .sum::<u64>()
        + elems::<VarDecl>(decls.local.len() + decls.call_params.len());
    charge(meter, syms_bytes)?;
    let mut syms = HashMap::new();
    for p in &decls.params {
        syms.insert(p.name.clone(), (Space::Param, u64::from(p.offset)));
    }
    let (shared_size, dyn_align) = layout(
        &decls.shared,
        Space::Shared,
        &mut syms,
        module.shared_end,
        &module.externs,
    )?;
    let mut locals = decls.local.clone();
    locals.extend(decls.call_params.iter().cloned());
    let (local_size, _) = layout(&locals, Space::Local, &mut syms, 0, &[])?;
    let mut labels = HashMap::new();
    let mut n = 0u32;
    for s in body {
        meter.tick()?;
        match s {
            Stmt::Label(l, pos) => {
                charge(meter, map_entry::<String, u32>() + str_bytes(l))?;
                if labels.insert(l.clone(), n).is_some() {
                    return Err(PtxError::Duplicate {
                        pos: *pos,
                        name: l.clone(),
                    });
                }
            }
            Stmt::Inst(_) => n += 1,
        }
    }
    if n as usize > MAX_INSTS {
        return Err(PtxError::TooLarge {
            pos: decls.pos,
            what: "instruction count".into(),
        });
    }
    // The decoded code, its positions and reconvergence points stay in the module; the CFG
    // analysis is transient.
    let kept = entry_code_bytes(n as usize + 1);
    meter.alloc(kept)?;
    charge(meter, cfg::BYTES_PER_INST * (u64::from(n) + 1))?;
    let mut ctx = Ctx {
        decls,
        regs: HashMap::new(),
        preds: HashMap::new(),
        syms,
        module,
        labels,
        pos: decls.pos,
        opcode: String::new(),
    };
    let mut code = Vec::with_capacity(n as usize + 1);
    let mut pos = Vec::with_capacity(n as usize + 1);
    let mut reg_entries = 0usize;
    for s in body {
        let Stmt::Inst(ri) = s else { continue };
        meter.tick()?;
        ctx.pos = ri.pos;
        ctx.opcode = ri.opcode.clone();
        let guard = match &ri.guard {
            Some((g, neg, gpos)) => Some((ctx.pred(g, *gpos)?, *neg)),
            None => None,
        };
        let inst = crate::decode_ops::decode_inst(&mut ctx, &ri.opcode, &ri.ops)?;
        // Dense register maps grow by at most a few names per instruction.
        let now = ctx.regs.len() + ctx.preds.len();
        if now > reg_entries {
            charge(
                meter,
                (now - reg_entries) as u64 * (map_entry::<String, u32>() + 16),
            )?;
            reg_entries = now;
        }
        charge(meter, op_heap_bytes(&inst))?;
        code.push(Op { inst, guard });
        pos.push(ri.pos);
    }
    // Falling off the end of the body is an implicit exit.
    code.push(Op {
        inst: Inst::Exit,
        guard: None,
    });
    pos.push(decls.pos);
    let ipdom = cfg::ipdoms(&code);
    charge(
        meter,
        str_bytes(&decls.name)
            + elems::<ParamInfo>(decls.params.len())
            + decls.params.iter().map(|p| str_bytes(&p.name)).sum::<u64>(),
    )?;
    let info = EntryInfo {
        name: decls.name.clone(),
        params: decls.params.clone(),
        param_size: decls.param_size,
        static_shared_bytes: shared_size as u32,
        dynamic_shared_align: dyn_align,
        local_bytes_per_thread: local_size as u32,
        reqntid: decls.reqntid,
        maxntid: decls.maxntid,
        instructions: code.len(),
    };
    let flag_regs = info
        .params
        .iter()
        .find(|p| p.name == crate::ckpt::bounds::FLAG_PARAM && p.size == 8)
        .map(|p| crate::ir::FlagRegs {
            param: p.offset,
            regs: [crate::ckpt::bounds::FLAG_REG, "%__ws_flag"]
                .iter()
                .filter_map(|n| ctx.regs.get(*n).copied())
                .collect(),
            pred: ctx.preds.get("%__ws_p").copied(),
        });
    let entry = Entry {
        info,
        flag_regs,
        nregs: ctx.regs.len() as u32,
        npreds: ctx.preds.len() as u32,
        code,
        pos,
        ipdom,
    };
    // The entry's own heap (Pack/Unpack operand lists, names) is kept: move its charge from
    // the transient total to the module.
    let own = entry.host_bytes() - elems::<Entry>(1) - kept;
    *transient = transient.saturating_sub(own);
    Ok(entry)
}

/// Host bytes of the code, source positions and reconvergence points of `n` instructions.
fn entry_code_bytes(n: usize) -> u64 {
    elems::<Op>(n) + elems::<Pos>(n) + elems::<u32>(n)
}

/// Heap bytes an instruction owns.
pub(crate) fn op_heap_bytes(i: &Inst) -> u64 {
    match i {
        Inst::Pack { parts, .. } => elems::<Src>(parts.capacity()),
        Inst::Unpack { ds, .. } => elems::<u32>(ds.capacity()),
        _ => 0,
    }
}

impl Entry {
    /// Host bytes this entry holds (its struct, code, positions, reconvergence points, the
    /// instructions' own operand lists and the names in its description).
    pub(crate) fn host_bytes(&self) -> u64 {
        elems::<Entry>(1)
            + elems::<Op>(self.code.capacity())
            + elems::<Pos>(self.pos.capacity())
            + elems::<u32>(self.ipdom.capacity())
            + self
                .code
                .iter()
                .map(|o| op_heap_bytes(&o.inst))
                .sum::<u64>()
            + str_bytes(&self.info.name)
            + elems::<ParamInfo>(self.info.params.capacity())
            + self
                .info
                .params
                .iter()
                .map(|p| str_bytes(&p.name))
                .sum::<u64>()
    }
}
