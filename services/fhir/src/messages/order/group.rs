//! Pass 1 of the order and result maps: the message's segments in their groups (patients, orders,
//! observations, specimens, notes); the segments no map covers are reported here.

use super::types::{Kind, Obs, Order, Pat, Spec};
use crate::context::Ctx;
use crate::segments::msh::MSH_MAPPED;
use crate::segments::pv1::Visit;

/// Where an NTE or OBX attaches: the last segment that opens something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Anchor {
    None,
    Patient,
    Order,
    Obx,
    Spm,
}

/// Pass 1: the message's segments in their groups; segments no map covers are reported here. True with
/// them when an ORC, OBR or SPM comes before any PID.
pub(super) fn group<'a>(cx: &mut Ctx<'a, '_>, map: Kind) -> (Vec<Pat<'a>>, bool) {
    let msg = cx.msg;
    let mut pats: Vec<Pat<'a>> = Vec::new();
    let mut orphans = false;
    let mut anchor = Anchor::None;
    for seg in msg.segments() {
        let name = seg.name();
        match name {
            b"MSH" => {
                cx.note_unmapped(&seg, MSH_MAPPED);
                continue;
            }
            b"PID" => {
                pats.push(Pat {
                    pid: seg,
                    visit: Visit::default(),
                    others: Vec::new(),
                    obs: Vec::new(),
                    orders: Vec::new(),
                    patient: None,
                    write: true,
                });
                anchor = Anchor::Patient;
                continue;
            }
            _ => {}
        }
        let Some(p) = pats.last_mut() else {
            orphans |= matches!(name, b"ORC" | b"OBR" | b"SPM");
            cx.note_unmapped_segment(&seg);
            continue;
        };
        match name {
            b"PV1" if p.visit.pv1.is_none() && p.orders.is_empty() => {
                p.visit.pv1 = Some(seg);
                anchor = Anchor::Patient;
            }
            b"PV2" if p.visit.pv2.is_none() && p.visit.pv1.is_some() && p.orders.is_empty() => {
                p.visit.pv2 = Some(seg);
            }
            b"NK1" | b"AL1" | b"IN1" if p.orders.is_empty() => {
                p.others.push((seg, None));
                anchor = Anchor::Patient;
            }
            b"DG1" => match p.orders.last_mut() {
                Some(o) if map == Kind::Orders => o.dg1.push((seg, None)),
                None if map == Kind::Orders => p.others.push((seg, None)),
                _ => cx.note_unmapped_segment(&seg),
            },
            b"ORC" => {
                p.orders.push(Order {
                    orc: Some(seg),
                    ..Order::default()
                });
                anchor = Anchor::Order;
            }
            b"OBR" => {
                match p.orders.last_mut() {
                    Some(o) if o.obr.is_none() && o.obs.is_empty() && o.specs.is_empty() => {
                        o.obr = Some(seg);
                    }
                    _ => p.orders.push(Order {
                        obr: Some(seg),
                        ..Order::default()
                    }),
                }
                anchor = Anchor::Order;
            }
            b"NTE" => {
                let notes = match (anchor, p.orders.last_mut()) {
                    (Anchor::Obx, Some(o)) => match o.specs.last_mut() {
                        Some(s) if !s.obs.is_empty() => s.obs.last_mut().map(|x| &mut x.notes),
                        _ => o.obs.last_mut().map(|x| &mut x.notes),
                    },
                    (Anchor::Obx, None) => p.obs.last_mut().map(|x| &mut x.notes),
                    (Anchor::Order, Some(o)) => Some(&mut o.notes),
                    _ => None,
                };
                match notes {
                    Some(n) => n.push(seg),
                    None => cx.note_unmapped_segment(&seg),
                }
            }
            b"OBX" => {
                let obs = Obs {
                    obx: seg,
                    notes: Vec::new(),
                    target: None,
                };
                match p.orders.last_mut() {
                    // An OBX between ORC and OBR (ORU's ORDER_DOCUMENT): the IG has no map for it.
                    Some(o) if o.obr.is_none() && map == Kind::Results => {
                        cx.note_unmapped_segment(&seg);
                        anchor = Anchor::None;
                        continue;
                    }
                    Some(o) => match o.specs.last_mut() {
                        Some(s) if matches!(anchor, Anchor::Spm) || !s.obs.is_empty() => {
                            s.obs.push(obs)
                        }
                        _ => o.obs.push(obs),
                    },
                    None => p.obs.push(obs),
                }
                anchor = Anchor::Obx;
            }
            b"SPM" => match p.orders.last_mut() {
                Some(o) => {
                    o.specs.push(Spec {
                        spm: seg,
                        obs: Vec::new(),
                        target: None,
                        write: true,
                    });
                    anchor = Anchor::Spm;
                }
                None => cx.note_unmapped_segment(&seg),
            },
            _ => {
                cx.note_unmapped_segment(&seg);
                // What follows a segment no map covers (TXA, FT1, SAC...) does not attach to what came before.
                if !matches!(name, b"PRT" | b"TQ1" | b"TQ2" | b"CTD" | b"TCD") {
                    anchor = Anchor::None;
                }
            }
        }
    }
    (pats, orphans)
}
