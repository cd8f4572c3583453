//! The statement-level module the checkpoint transformation works on: a parsed text with every
//! `.func` call of its entries inlined (the same expansion the decoder uses), its module
//! variables and directives, loaded within the budgets of [`LoadOptions`].

use crate::decode::{EntryDecls, Stmt, VarDecl};
use crate::error::PtxError;
use crate::load::{LoadOptions, Meter};
use crate::modvars::RawModVar;

/// One entry after inlining: its declarations and statement body.
pub(crate) struct StmtEntry {
    pub decls: EntryDecls,
    pub body: Vec<Stmt>,
}

/// A whole module at statement level.
pub(crate) struct StmtModule {
    pub version: String,
    pub targets: Vec<String>,
    pub shared: Vec<VarDecl>,
    pub vars: Vec<RawModVar>,
    pub entries: Vec<StmtEntry>,
    /// The load's meter (later stages charge their work to it too).
    pub meter: Meter,
}

/// Parse `text` and inline the calls of every entry, within the budgets of `opts`.
///
/// The result is also checked by the decoder (a full [`crate::parse_with`]), so every entry
/// is known to decode: later stages may rely on the names and operands being valid.
pub(crate) fn load(text: &str, opts: &LoadOptions) -> Result<StmtModule, PtxError> {
    crate::parse_with(text, opts)?;
    let items = crate::parser::parse_items(text, opts)?;
    let mut meter = items.meter;
    let mut entries = Vec::with_capacity(items.parsed.len());
    for (mut decls, body) in items.parsed {
        let body = crate::inline::expand_calls(&mut decls, body, &items.funcs, &mut meter)?;
        entries.push(StmtEntry { decls, body });
    }
    Ok(StmtModule {
        version: items.version,
        targets: items.targets,
        shared: items.module_shared,
        vars: items.raw_vars,
        entries,
        meter,
    })
}
