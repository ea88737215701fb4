package io.hl7gw.fhir;

import ca.uhn.fhir.rest.annotation.ConditionalUrlParam;
import ca.uhn.fhir.rest.annotation.Create;
import ca.uhn.fhir.rest.annotation.Delete;
import ca.uhn.fhir.rest.annotation.IdParam;
import ca.uhn.fhir.rest.annotation.Read;
import ca.uhn.fhir.rest.annotation.ResourceParam;
import ca.uhn.fhir.rest.annotation.Search;
import ca.uhn.fhir.rest.annotation.Update;
import ca.uhn.fhir.rest.api.MethodOutcome;
import ca.uhn.fhir.rest.api.server.IBundleProvider;
import ca.uhn.fhir.rest.api.server.RequestDetails;
import ca.uhn.fhir.rest.server.IResourceProvider;
import ca.uhn.fhir.rest.server.SimpleBundleProvider;
import ca.uhn.fhir.rest.server.exceptions.InvalidRequestException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.hl7.fhir.instance.model.api.IBaseResource;
import org.hl7.fhir.instance.model.api.IIdType;
import org.hl7.fhir.r4.model.IdType;

/** One resource type's REST API over the shared Store: read, create (If-None-Exist), update (by id or
 *  conditional), delete, search. The same class serves every type. */
public final class TypeProvider implements IResourceProvider {
    private final Class<? extends IBaseResource> type;
    private final String name;
    private final Store store;

    TypeProvider(Class<? extends IBaseResource> type, String name, Store store) {
        this.type = type;
        this.name = name;
        this.store = store;
    }

    @Override
    public Class<? extends IBaseResource> getResourceType() {
        return type;
    }

    @Read
    public IBaseResource read(@IdParam IIdType id) {
        return store.read(name, id.getIdPart());
    }

    @Create
    public MethodOutcome create(@ResourceParam IBaseResource resource, @ConditionalUrlParam String ifNoneExist) {
        return outcome(store.create(name, resource, ifNoneExist));
    }

    @Update
    public MethodOutcome update(@IdParam IIdType id, @ResourceParam IBaseResource resource,
            @ConditionalUrlParam String conditional) {
        if (conditional != null) {
            return outcome(store.conditionalUpdate(name, conditional, resource));
        }
        if (id == null || !id.hasIdPart()) {
            throw new InvalidRequestException("PUT needs an id or a condition in the URL");
        }
        return outcome(store.update(name, id.getIdPart(), resource));
    }

    @Delete
    public MethodOutcome delete(@IdParam IIdType id, @ConditionalUrlParam String conditional) {
        store.delete(name, id == null ? null : id.getIdPart(), conditional);
        return new MethodOutcome();
    }

    @Search(allowUnknownParams = true)
    public IBundleProvider search(RequestDetails request) {
        Map<String, List<String>> params = new LinkedHashMap<>();
        request.getParameters().forEach((k, v) -> params.put(k, new ArrayList<>(List.of(v))));
        return new SimpleBundleProvider(new ArrayList<IBaseResource>(store.searchCopies(name, params)));
    }

    private static MethodOutcome outcome(Store.Outcome o) {
        Store.Stored s = o.stored();
        MethodOutcome out = new MethodOutcome(new IdType(s.type(), s.id(), Long.toString(s.version())));
        out.setCreated(o.status() == 201);
        out.setResource(s.resource().copy());
        return out;
    }
}
