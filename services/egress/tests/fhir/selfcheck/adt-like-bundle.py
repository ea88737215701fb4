#!/usr/bin/env python3
"""Writes N transaction Bundles shaped like an ADT_A01's (Patient, Encounter, RelatedPerson, AllergyIntolerance,
Condition, Coverage, Organization, Practitioner, 5 Observations, Provenance) into DIR, each entry conditional
(ifNoneExist or a conditional PUT by identifier; Provenance, which has no identifier, by a PUT to a fixed id),
so that delivering them twice adds nothing: the self-check's input for `validate` and the server's timings
(usage: adt-like-bundle.py DIR N)."""
import json, os, sys, uuid

out, n = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
MRN = "urn:oid:2.16.840.1.113883.19.5"
for k in range(n):
    u = lambda: "urn:uuid:" + str(uuid.uuid4())
    pat, enc, org, dr = u(), u(), u(), u()
    def entry(full, res, method="POST", cond=None):
        if method == "PUT" and cond is None:  # by identifier
            i = res["identifier"][0]
            cond = f"{res['resourceType']}?identifier={i['system']}|{i['value']}"
        req = {"method": method, "url": res["resourceType"] if method == "POST" else cond}
        if method == "POST" and cond:
            req["ifNoneExist"] = cond
        return {"fullUrl": full, "resource": res, "request": req}
    ids = lambda tag: [{"system": "urn:x-hl7gw-selfcheck", "value": f"{tag}-{k}"}]
    e = [
        entry(pat, {"resourceType": "Patient", "identifier": [{"system": MRN, "value": f"MRN{k:05d}"}],
                    "name": [{"family": "Doe", "given": ["Jan", str(k)]}], "gender": "female",
                    "birthDate": "1970-01-%02d" % (k % 28 + 1),
                    "address": [{"line": [f"{k} Main St"], "city": "Springfield", "postalCode": "12345"}],
                    "telecom": [{"system": "phone", "value": "555-0100", "use": "home"}]},
              cond=f"identifier={MRN}|MRN{k:05d}"),
        entry(org, {"resourceType": "Organization", "identifier": [{"system": "urn:x-fac", "value": "FAC1"}],
                    "name": "General Hospital"}, cond="identifier=urn:x-fac|FAC1"),
        entry(dr, {"resourceType": "Practitioner", "identifier": [{"system": "urn:x-npi", "value": "1234"}],
                   "name": [{"family": "Who", "given": ["John"]}]}, cond="identifier=urn:x-npi|1234"),
        entry(enc, {"resourceType": "Encounter", "identifier": [{"system": MRN + ".1", "value": f"V{k:05d}"}],
                    "status": "in-progress",
                    "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "IMP"},
                    "subject": {"reference": pat}, "serviceProvider": {"reference": org},
                    "participant": [{"individual": {"reference": dr}}],
                    "period": {"start": "2024-03-01T08:30:00Z"}},
              method="PUT", cond=f"Encounter?identifier={MRN}.1|V{k:05d}"),
        entry(u(), {"resourceType": "RelatedPerson", "identifier": ids("NK1-1"), "patient": {"reference": pat},
                    "relationship": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0063", "code": "MTH"}]}],
                    "name": [{"family": "Doe", "given": ["Mary"]}]}, "PUT"),
        entry(u(), {"resourceType": "AllergyIntolerance", "identifier": ids("AL1-1"), "patient": {"reference": pat},
                    "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/allergyintolerance-clinical", "code": "active"}]},
                    "code": {"coding": [{"system": "http://snomed.info/sct", "code": "91936005"}], "text": "Penicillin"}}, "PUT"),
        entry(u(), {"resourceType": "Condition", "identifier": ids("DG1-1"), "subject": {"reference": pat}, "encounter": {"reference": enc},
                    "code": {"coding": [{"system": "http://hl7.org/fhir/sid/icd-10-cm", "code": "J18.9"}]}}, "PUT"),
        entry(u(), {"resourceType": "Coverage", "status": "active", "beneficiary": {"reference": pat},
                    "payor": [{"reference": org}], "identifier": [{"system": "urn:x-ins", "value": f"POL{k}"}]}, "PUT"),
    ]
    for j, (code, val, unit) in enumerate([("8867-4", 72, "/min"), ("8310-5", 37.2, "Cel"), ("29463-7", 70.5, "kg"),
                                           ("8302-2", 172, "cm"), ("2345-7", 99, "mg/dL")]):
        e.append(entry(u(), {"resourceType": "Observation", "identifier": ids(f"OBX-{j + 1}"), "status": "final", "subject": {"reference": pat},
                             "encounter": {"reference": enc},
                             "code": {"coding": [{"system": "http://loinc.org", "code": code}]},
                             "effectiveDateTime": "2024-03-01T08:30:00Z",
                             "valueQuantity": {"value": val, "unit": unit, "system": "http://unitsofmeasure.org", "code": unit}}, "PUT"))
    e.append(entry(u(), {"resourceType": "Provenance", "id": f"selfcheck-{k}", "target": [{"reference": pat}, {"reference": enc}],
                         "recorded": "2024-03-01T08:30:00Z",
                         "activity": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-DataOperation", "code": "CREATE"}]},
                         "agent": [{"who": {"reference": org}}]}, "PUT", f"Provenance/selfcheck-{k}"))
    with open(os.path.join(out, f"adt-{k:04d}.json"), "w") as f:
        json.dump({"resourceType": "Bundle", "type": "transaction", "entry": e}, f)
