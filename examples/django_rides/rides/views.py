"""``POST /rides``: the ride and its record in one ``transaction.atomic()`` block."""

import json
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from unilog.django import emit

from .models import Ride


@csrf_exempt
@require_POST
def create_ride(request: HttpRequest) -> JsonResponse:
    try:
        distance = Decimal(str(json.loads(request.body)["distance"])).quantize(Decimal("0.001"))
    except (ValueError, KeyError, TypeError, InvalidOperation):
        return JsonResponse({"error": {"field": "distance", "message": "distance must be a number"}}, status=422)
    if not distance.is_finite() or distance < 0:
        return JsonResponse({"error": {"field": "distance", "message": "distance must be >= 0"}}, status=422)
    with transaction.atomic():
        ride = Ride.objects.create(distance=distance)
        emit(action="create", object="ride", data={"id": ride.id, "distance": str(distance)},
             stream=settings.UNILOG_STREAM, key=f"ride-{ride.id}")
    return JsonResponse({"ride": {"id": ride.id, "distance": str(distance)}}, status=201)
