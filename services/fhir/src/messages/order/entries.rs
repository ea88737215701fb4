//! Pass 3 of the order and result maps, per order: its entries (ServiceRequest, Conditions, Specimens,
//! Observations, DiagnosticReport) and what of its segments they left unmapped.

use super::report::report_body;
use super::request::service_request_body;
use super::specimen::{specimen_body, specimen_mapped};
use super::types::{Kind, Obs, Order, Pat};
use crate::bundle::Entries;
use crate::context::{Ctx, Target};
use crate::messages::common::{observation_entry, patient_part_entry};
use crate::segments::nte::NTE_MAPPED;
use crate::segments::obx::ObsLinks;

/// An OBX (and its NTE) as its planned Observation.
pub(super) fn planned_observation<'a>(
    cx: &mut Ctx<'a, '_>,
    b: &mut Entries<'_>,
    o: &Obs<'a>,
    links: ObsLinks<'_, 'a>,
) {
    let t = o.target.as_ref().expect("planned");
    observation_entry(cx, b, t, &o.obx, &o.notes, links);
}

/// An order's entries: ServiceRequest, Conditions, Specimens, Observations, DiagnosticReport.
pub(super) fn order_entries<'a>(
    cx: &mut Ctx<'a, '_>,
    b: &mut Entries<'_>,
    map: Kind,
    p: &Pat<'a>,
    o: &Order<'a>,
) {
    let patient = p.patient.as_ref().expect("planned");
    let request = o.request.as_ref().expect("planned");
    let spec_targets: Vec<&Target> = o.specs.iter().filter_map(|s| s.target.as_ref()).collect();
    let obs_targets: Vec<&Target> = o.obs.iter().filter_map(|x| x.target.as_ref()).collect();
    let conditions: Vec<&Target> = o.dg1.iter().filter_map(|(_, t)| t.as_ref()).collect();

    let (mut orc_mapped, mut obr_mapped) = b.entry(cx, request, |cx, w| {
        service_request_body(
            cx,
            w,
            map,
            o,
            patient,
            p.visit.encounter.as_ref(),
            &conditions,
            &obs_targets,
            &spec_targets,
        )
    });
    for nte in &o.notes {
        cx.note_unmapped(nte, NTE_MAPPED);
    }

    for (seg, t) in &o.dg1 {
        patient_part_entry(cx, b, seg, t.as_ref().expect("planned"), patient);
    }
    for s in &o.specs {
        let t = s.target.as_ref().expect("planned");
        if s.write {
            b.entry(cx, t, |cx, w| specimen_body(cx, w, &s.spm, t, patient));
        }
        let mut mapped = specimen_mapped(cx, &s.spm);
        if s.write && t.repeat {
            mapped.retain(|&n| n != 2);
        }
        cx.note_unmapped(&s.spm, &mapped);
    }
    let observed = match map {
        Kind::Results => o
            .obr
            .as_ref()
            .and_then(|obr| cx.field(obr, 7))
            .and_then(|d| cx.date_time(&d)),
        Kind::Orders => None,
    };
    let links = ObsLinks {
        patient: Some(patient),
        encounter: p.visit.encounter.as_ref(),
        effective: observed.as_deref(),
        ..ObsLinks::default()
    };
    for x in &o.obs {
        planned_observation(cx, b, x, links);
    }
    for s in &o.specs {
        let focus = ObsLinks {
            focus: s.target.as_ref(),
            encounter: None,
            ..links
        };
        for x in &s.obs {
            planned_observation(cx, b, x, focus);
        }
    }
    if let Some(report) = &o.report {
        let mapped = b.entry(cx, report, |cx, w| {
            report_body(
                cx,
                w,
                o,
                request,
                patient,
                p.visit.encounter.as_ref(),
                &obs_targets,
                &spec_targets,
            )
        });
        obr_mapped.extend(mapped);
        if !report.repeat {
            // The report carries the order numbers (when the ServiceRequest, a repeat, does not).
            orc_mapped.extend([2, 3]);
        }
    }
    if let Some(orc) = &o.orc {
        cx.note_unmapped(orc, &orc_mapped);
    }
    if let Some(obr) = &o.obr {
        cx.note_unmapped(obr, &obr_mapped);
    }
}
