from django.urls import path
from rides import views

urlpatterns = [path("rides", views.create_ride)]
