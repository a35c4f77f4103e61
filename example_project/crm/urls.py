from django.urls import path

from example_project.crm import views

app_name = "crm"

urlpatterns = [
    path("", views.home, name="home"),
    path("w/<slug:slug>/", views.workspace, name="workspace"),
    path("w/<slug:slug>/server-rendered/", views.server_rendered, name="server_rendered"),
    path("w/<slug:slug>/server-rendered/rows", views.contact_rows, name="contact_rows"),
    path("api/w/<slug:slug>/contacts", views.contacts, name="contacts"),
    path("api/contacts/<int:pk>", views.contact, name="contact"),
    path("api/contacts/<int:pk>/move", views.move_contact, name="move_contact"),
]
